"""The speed machinery under a decoder's steps (and a bfloat16 encoder's attention); the generic engine
(`decoding.engine`, drafts, schedules, beam search, caches) reads and runs without it: only the adapters (and the
model loader, for the encoder) reach it.

- `products`: the CPU products and attention (oneDNN, `WidenedLinear`, `Attention`) and the switches that turn
  them off for comparisons (`reference_kernels`, `onednn_only`, `full_head`).
- `native`: row-by-row products and attention in C (`csrc/rowdot.c`), compiled on this machine at first use.
- `int8`: the weight-only int8 layer (`Int8Linear`) of the `--dtype int8` model and the int8 drafts.
- `screened_head`: a float32 head's greedy argmax screened through bfloat16 or int8.
- `native_step`: a decoder step of a few tokens as one native call.
- `graphed_step`: a decoder's steps on a GPU as replayed CUDA graphs.
- `encoder_attention`: a bfloat16 encoder's self-attention in one native call (AVX512-BF16 without AMX).

The Whisper adapter (`asr.whisper.decoder`), the text models' direct passes (`decoding.causal_lm`) and the
model loader (`asr.models.registry`: `use_cpu_kernels`, `use_native_encoder_attention`) use them; nothing here
imports `asr`.
"""
