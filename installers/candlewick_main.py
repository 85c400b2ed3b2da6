"""Entry point of the PyInstaller bundle: the same `candlewick` command as the pip install.

A bundle has no Python interpreter to start, so the first-load probe (engine.native.load_probe)
starts this executable again with CHILD_ARG: that child is handled first, before Qt or the
app is imported, so it costs little more than `python -m engine.native.native_load`. A
quantization (engine.native.quantize_process) and speech to text (engine.speech.transcriber)
start it with their own arguments the same way.
"""

import sys

# Lean on purpose (ctypes and json): the child must not pay for the app's imports.
from engine.native.native_load import CHILD_ARG
from engine.native.native_load import main as native_load
from engine.native.quantize_child import CHILD_ARG as QUANTIZE_CHILD_ARG
from engine.native.quantize_child import main as quantize_child
from engine.speech.whisper_child import CHILD_ARG as WHISPER_CHILD_ARG
from engine.speech.whisper_child import main as whisper_child

if __name__ == "__main__":
    if sys.argv[1:] == [CHILD_ARG]:
        native_load()
        sys.exit(0)
    if sys.argv[1:] == [QUANTIZE_CHILD_ARG]:  # a quantization (engine.native.quantize_process)
        quantize_child()
        sys.exit(0)
    if sys.argv[1:] == [WHISPER_CHILD_ARG]:  # speech to text (engine.speech.transcriber)
        whisper_child()
        sys.exit(0)

    import multiprocessing

    multiprocessing.freeze_support()  # a frozen app re-executes itself for child processes

    from app.cli import main

    sys.exit(main())
