"""Transcribing datasets: items from a source (`sources`), results as JSON lines (`output`), the run (`run`) and
its processes (`shards`)."""
