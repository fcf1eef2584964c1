"""Whisper's own rules, one window at a time: the decoder as the engine sees it (`decoder`), the encoder pass,
temperature fallback and segments of one window (`window`), the logit rules (`logit_rules`), word timestamps
(`alignment`) and the spoken language (`language`). The long-form algorithms above them are in `asr`."""
