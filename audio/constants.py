"""Whisper's audio numbers, in one place that imports nothing heavy (command lines and the eval runner use them)."""

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_LENGTH = 30  # seconds in one Whisper window
N_SAMPLES = CHUNK_LENGTH * SAMPLE_RATE  # 480000 samples in one window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames in one window
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH  # 100 frames: 10 ms each
