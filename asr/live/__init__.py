"""Live transcription: a growing audio buffer re-decoded every step, committed where two hypotheses agree
(LocalAgreement-2, after ufal/whisper_streaming), each re-decode drafted by the last hypothesis."""

from asr.live.transcriber import CommittedSegment, StreamStats, StreamingTranscriber

__all__ = ["CommittedSegment", "StreamStats", "StreamingTranscriber"]
