"""A system tray for Xvfb, which has none, and a window manager's close button.

`own_the_tray` owns the `_NET_SYSTEM_TRAY_S0` selection and announces it with the MANAGER
message, as a desktop's tray does (freedesktop.org System Tray Protocol), so Qt's
QSystemTrayIcon finds a tray and shows its icon. It docks nothing: the tests read the icon's
state from Qt, not from pixels. It runs as a child process (`python tray_manager.py` with
DISPLAY set): it prints "ready" once it owns the selection, and holds it until its stdin is
closed. `ask_to_close` sends a window the message a window manager sends for its close button.
libX11 through ctypes: each is a few calls, not worth a binding package.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CLIENT_MESSAGE = 33  # X.h: the event type
STRUCTURE_NOTIFY_MASK = 1 << 17
CURRENT_TIME = 0


class ClientMessage(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("serial", ctypes.c_ulong),
        ("send_event", ctypes.c_int),
        ("display", ctypes.c_void_p),
        ("window", ctypes.c_ulong),
        ("message_type", ctypes.c_ulong),
        ("format", ctypes.c_int),
        ("l", ctypes.c_long * 5),
    ]


class XEvent(ctypes.Union):
    _fields_ = [("xclient", ClientMessage), ("pad", ctypes.c_long * 24)]  # Xlib's size


def libx11() -> ctypes.CDLL:
    """libX11 with the signatures of the calls used here."""
    name = ctypes.util.find_library("X11")
    if name is None:
        raise SystemExit("libX11 is not installed")
    x = ctypes.CDLL(name)
    ulong, ptr = ctypes.c_ulong, ctypes.c_void_p
    x.XOpenDisplay.restype, x.XOpenDisplay.argtypes = ptr, [ctypes.c_char_p]
    x.XCloseDisplay.argtypes = [ptr]
    x.XDefaultRootWindow.restype, x.XDefaultRootWindow.argtypes = ulong, [ptr]
    x.XInternAtom.restype = ulong
    x.XInternAtom.argtypes = [ptr, ctypes.c_char_p, ctypes.c_int]
    x.XCreateSimpleWindow.restype = ulong
    x.XCreateSimpleWindow.argtypes = [ptr, ulong, *[ctypes.c_int] * 2, *[ctypes.c_uint] * 3]
    x.XCreateSimpleWindow.argtypes += [ulong, ulong]
    x.XSetSelectionOwner.argtypes = [ptr, ulong, ulong, ulong]
    x.XGetSelectionOwner.restype, x.XGetSelectionOwner.argtypes = ulong, [ptr, ulong]
    x.XSendEvent.argtypes = [ptr, ulong, ctypes.c_int, ctypes.c_long, ptr]
    x.XSync.argtypes = [ptr, ctypes.c_int]
    return x


def ask_to_close(window_id: int) -> None:
    """What a window manager sends when the user clicks a window's close button: the
    WM_DELETE_WINDOW message (ICCCM), so the app gets a close event from the window system."""
    x = libx11()
    display = x.XOpenDisplay(None)
    assert display, "cannot open the display"
    try:
        event = XEvent()
        event.xclient.type = CLIENT_MESSAGE
        event.xclient.window = window_id
        event.xclient.message_type = x.XInternAtom(display, b"WM_PROTOCOLS", 0)
        event.xclient.format = 32
        event.xclient.l[:2] = [x.XInternAtom(display, b"WM_DELETE_WINDOW", 0), CURRENT_TIME]
        x.XSendEvent(display, window_id, 0, 0, ctypes.byref(event))
        x.XSync(display, 0)
    finally:
        x.XCloseDisplay(display)


def own_the_tray() -> None:
    x = libx11()
    display = x.XOpenDisplay(None)
    if not display:
        raise SystemExit("cannot open the display")
    root = x.XDefaultRootWindow(display)
    selection = x.XInternAtom(display, b"_NET_SYSTEM_TRAY_S0", 0)
    window = x.XCreateSimpleWindow(display, root, 0, 0, 1, 1, 0, 0, 0)
    x.XSetSelectionOwner(display, selection, window, CURRENT_TIME)
    if x.XGetSelectionOwner(display, selection) != window:
        raise SystemExit("another tray owns the selection")
    event = XEvent()
    event.xclient.type = CLIENT_MESSAGE
    event.xclient.window = root
    event.xclient.message_type = x.XInternAtom(display, b"MANAGER", 0)
    event.xclient.format = 32
    event.xclient.l[:3] = [CURRENT_TIME, selection, window]
    x.XSendEvent(display, root, 0, STRUCTURE_NOTIFY_MASK, ctypes.byref(event))
    x.XSync(display, 0)
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes the pipe; the selection goes with the process


@contextmanager
def system_tray() -> Iterator[None]:
    """A tray on this process's X server while inside."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = proc.stdout.readline().strip()
        assert line == "ready", f"the tray did not start: {line!r} (exit {proc.poll()})"
        yield
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
        proc.stdout.close()


if __name__ == "__main__":
    own_the_tray()
