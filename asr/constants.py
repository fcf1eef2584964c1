"""The choices the command line and the eval configurations offer, in one place that imports nothing heavy."""

DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "float16", "bfloat16", "int8")
# Text models (`asr generate`) have no int8 form.
TEXT_DTYPES = DTYPES[:-1]
OFFLOADS = ("none", "cpu", "disk")
TASKS = ("transcribe", "translate")
OUTPUT_FORMATS = ("txt", "srt", "vtt", "tsv", "json")
# openai-whisper's fallback temperatures: a window that fails the checks is decoded again at the next one.
TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
