"""Speech: transcription of a recording and synthesis of an answer, on this machine."""
