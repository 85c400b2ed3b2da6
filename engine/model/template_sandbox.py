"""A Jinja sandbox for untrusted chat templates, bounded in time, size and attribute access.

Jinja's `ImmutableSandboxedEnvironment` keeps a template away from Python internals, but a
template can still loop for hours (nested `range()`), recurse, or build a gigabyte in one
operation (`'x' * 10**9`) before anyone looks at its output. This environment adds:

- a step count and a wall-clock deadline, checked on every loop iteration, call, filter and
  intercepted operator, so no loop or recursion runs unbounded;
- a size check *before* each operation that can make a large value from small ones (`*`,
  `+`, `~`, `%`, `**`, `range()`, `join`, `sum`, width arguments of filters and string
  methods), since a single C-level call cannot be interrupted once started;
- a budget on all characters the template builds during one render, so many moderate values
  cannot add up to a large one;
- an unsafe attribute raises at once instead of rendering as an empty string.

Every stop raises `TemplateLimitError` with a one-line reason.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
import string
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, cast

from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.filters import make_attrgetter
from jinja2.runtime import Context, Macro, Undefined
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace, _PassArg, pass_environment
from jinja2.visitor import NodeTransformer

# Steps are loop iterations, calls, filters, operators and lookups; real templates take
# 8-13 per message. The budgets grow with the conversation so that no real one hits them.
STEPS_BASE = 50_000
STEPS_PER_MESSAGE = 500
BUILT_CHARS_BASE = 32_000_000  # all strings built in one render, output and intermediate ones
BUILT_CHARS_PER_INPUT_CHAR = 16
MAX_SECONDS = 0.5  # a backstop for steps that are slow one by one
MAX_ITEMS = 100_000  # range() length and list sizes; Jinja's own MAX_RANGE
MAX_VALUE_CHARS = 8_000_000  # one string (the whole prompt may be this long)
MAX_INT_BITS = 4096
MAX_SLOW_FILTER_CHARS = 100_000  # urlize, wordwrap, title...: up to ~1 s per million characters


class TemplateLimitError(Exception):
    """A template went past a bound; `str()` is one line."""


@dataclass
class _Run:
    deadline: float = float("inf")
    max_steps: int = STEPS_BASE
    max_built: int = BUILT_CHARS_BASE
    steps: int = 0
    built: int = 0

    def step(self) -> None:
        self.steps += 1
        if self.steps > self.max_steps:
            raise TemplateLimitError(f"ran more than {self.max_steps:,} steps")
        self.check_time()

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimitError(f"ran longer than {MAX_SECONDS:g} s")

    def charge(self, chars: int) -> None:
        self.built += chars
        if self.built > self.max_built:
            raise TemplateLimitError(f"built more than {self.max_built:,} characters")


_RUN: ContextVar[_Run | None] = ContextVar("template_run", default=None)


def _run() -> _Run:
    # Outside a render (Jinja folds constants while compiling) sizes are still checked.
    return _RUN.get() or _Run()


@contextmanager
def bounded_render(messages: int = 0, input_chars: int = 0) -> Iterator[None]:
    """Steps, time and the character budget count from here; rendering must happen inside."""
    run = _Run(
        deadline=time.monotonic() + MAX_SECONDS,
        max_steps=STEPS_BASE + STEPS_PER_MESSAGE * messages,
        max_built=BUILT_CHARS_BASE + BUILT_CHARS_PER_INPUT_CHAR * input_chars,
    )
    token = _RUN.set(run)
    try:
        yield
    finally:
        _RUN.reset(token)


def _too_long(chars: int, what: str = "a text") -> TemplateLimitError:
    return TemplateLimitError(
        f"tried to build {what} of {chars:,} characters (the limit is {MAX_VALUE_CHARS:,})"
    )


def _check_chars(chars: int, what: str = "a text") -> None:
    if chars > MAX_VALUE_CHARS:
        raise _too_long(chars, what)


def _check_items(count: int, what: str = "a list") -> None:
    if count > MAX_ITEMS:
        raise TemplateLimitError(
            f"tried to build {what} of {count:,} items (the limit is {MAX_ITEMS:,})"
        )


_END = object()


_SCALARS = frozenset({int, float, bool, type(None)})
_VIEWS: tuple[type, ...] = (type({}.keys()), type({}.values()), type({}.items()), set, frozenset)


def _children(item: Any) -> Iterator[Any] | None:
    """The items `str(item)` prints, for containers; None for anything printed short."""
    if isinstance(item, (list, tuple, *_VIEWS)):
        return iter(cast("Iterable[Any]", item))
    if isinstance(item, Mapping):
        return iter(item.items())
    if isinstance(item, Namespace):
        attrs: dict[str, Any] = object.__getattribute__(item, "_Namespace__attrs")
        return iter(attrs.items())
    return None  # numbers, range(), generators, Undefined, macros: a short repr


def _weight(value: Any, limit: int = MAX_VALUE_CHARS) -> int:
    """About how many characters `str(value)` takes, counted until `limit` is passed.

    A list holding the same long string many times is small in memory but not as text, so
    shared items count each time they appear; a container met again is not walked again.
    Each item counts at least 8 (quotes, comma, a short number).
    """
    if isinstance(value, str):
        return len(value)
    run, known, running = _run(), dict[int, int](), 0
    stack: list[list[Any]] = [[None, iter((value,)), 0]]  # [container, its items, its weight]
    while running <= limit:
        frame = stack[-1]
        item = next(frame[1], _END)
        if item is _END:
            stack.pop()
            if not stack:
                break
            known[id(frame[0])] = frame[2]
            stack[-1][2] += frame[2]
            continue
        kind, children = type(item), None
        if isinstance(item, str):
            add = 8 + len(item)
        else:
            add = 8
            children = None if kind in _SCALARS else _children(item)
        if children is not None and id(item) in known:
            add += known[id(item)]
        elif children is not None:
            stack.append([item, children, 0])
        frame[2] += add
        running += add
        if not running & 0xFFF:
            run.check_time()
    return running


def _charge(value: Any) -> Any:
    chars = _weight(value)
    _check_chars(chars)
    _run().charge(chars)
    return value


def _as_text(value: Any) -> str:
    _check_chars(_weight(value))
    return str(value)


def _int_bits(value: Any) -> int:
    return value.bit_length() if isinstance(value, int) else 0


def _check_mul(left: Any, right: Any) -> None:
    if isinstance(left, int) and isinstance(right, int):
        if _int_bits(left) + _int_bits(right) > MAX_INT_BITS:
            raise TemplateLimitError(f"tried to build a number of more than {MAX_INT_BITS} bits")
        return
    seq, times = (left, right) if isinstance(right, int) else (right, left)
    if not isinstance(times, int) or times <= 0:
        return
    if isinstance(seq, str):
        _check_chars(len(seq) * times)
    elif isinstance(seq, (list, tuple)):
        _check_items(len(seq) * times)
        _check_chars(_weight(seq) * times)


def _check_add(left: Any, right: Any) -> None:
    if isinstance(left, str) and isinstance(right, str):
        _check_chars(len(left) + len(right))
    elif isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
        _check_items(len(left) + len(right))
        _check_chars(_weight(left) + _weight(right))
    elif (
        isinstance(left, int)
        and isinstance(right, int)
        and (max(_int_bits(left), _int_bits(right)) >= MAX_INT_BITS)
    ):
        raise TemplateLimitError(f"tried to build a number of more than {MAX_INT_BITS} bits")


def _check_pow(left: Any, right: Any) -> None:
    ints = isinstance(left, int) and isinstance(right, int)
    if ints and right > 0 and abs(left) > 1 and _int_bits(left) * right > MAX_INT_BITS:
        raise TemplateLimitError(f"tried to build a number of more than {MAX_INT_BITS} bits")


# A printf conversion's width and precision: `%-10.3f`, `%*d`, `%(name)08x`.
_PRINTF_SIZES = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")


def _check_printf(fmt: str, args: Any) -> None:
    for width, precision in _PRINTF_SIZES.findall(fmt):
        for size in (width, precision):
            if size == "*":
                raise TemplateLimitError("a printf width from the arguments ('*') is not allowed")
            if size:
                _check_chars(int(size), "a formatted field")
    _check_chars(len(fmt) + _weight(args))


def _check_format(fmt: str, args: Iterable[Any]) -> None:
    for _, _, spec, _ in string.Formatter().parse(fmt):
        if spec and "{" in spec:
            raise TemplateLimitError("a format width from the arguments ('{:{w}}') is not allowed")
        for size in re.findall(r"\d+", spec or ""):
            _check_chars(int(size), "a formatted field")
    _check_chars(len(fmt) + sum(_weight(a) for a in args))


def bounded_join(sep: str, items: Iterable[Any]) -> str:
    run, parts, total = _run(), [], 0
    for item in items:
        run.step()
        text = _as_text(item)
        total += len(text) + len(sep)
        _check_chars(total)
        parts.append(text)
    return sep.join(parts)


def _line_bound(text: str) -> int:
    return text.count("\n") + text.count("\r") + 1


def _split_bound(text: str, sep: str | None) -> int:
    if sep:
        return text.count(sep) + 1
    return sum(text.count(c) for c in " \t\n\r\x0b\x0c") + 1


def _check_str_method(owner: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    arg = args[0] if args else next(iter(kwargs.values()), None)
    if name in ("center", "ljust", "rjust", "zfill") and isinstance(arg, int):
        _check_chars(arg)
    elif name == "expandtabs" and isinstance(arg, int):
        _check_chars(len(owner) + owner.count("\t") * arg)
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str):
        old, new = args[0], str(args[1])
        hits = owner.count(old) if old else len(owner) + 1
        _check_chars(len(owner) + hits * (len(new) - len(old)))
    elif name in ("split", "rsplit", "splitlines"):
        sep = arg if isinstance(arg, str) and name != "splitlines" else None
        _check_items(_split_bound(owner, sep) if name != "splitlines" else _line_bound(owner))
    elif name in ("format", "format_map"):
        _check_format(owner, [*args, *kwargs.values()])


def _check_slow_input(name: str, text: str) -> None:
    # Pure-Python filters that take seconds on a few megabytes, in one call we cannot stop.
    if len(text) > MAX_SLOW_FILTER_CHARS:
        raise TemplateLimitError(
            f"gave |{name} a text of {len(text):,} characters "
            f"(the limit is {MAX_SLOW_FILTER_CHARS:,})"
        )


def _check_filter(name: str, bound: Mapping[str, Any]) -> None:
    """Arguments of built-in filters that set how large their result is."""
    text = next((bound[k] for k in ("s", "value") if k in bound), None)
    if name == "center":
        _check_chars(int(bound.get("width", 80)))
    elif name == "indent" and isinstance(text, str):
        width = bound.get("width", 4)
        per_line = len(width) if isinstance(width, str) else int(width)
        _check_chars(len(text) + _line_bound(text) * per_line)
    elif name == "wordwrap" and isinstance(text, str):
        _check_slow_input(name, text)
        wrap = bound.get("wrapstring") or "\n"
        _check_chars(len(text) + (len(text) + 1) * len(str(wrap)))
    elif name == "format" and isinstance(text, str):
        _check_printf(text, bound.get("args", ()))
    elif name == "replace" and isinstance(text, str):
        old, new = str(bound["old"]), str(bound["new"])
        hits = text.count(old) if old else len(text) + 1
        _check_chars(len(text) + hits * (len(new) - len(old)))
    elif name == "batch":
        _check_items(int(bound["linecount"]), "a batch")
    elif name == "slice":
        _check_items(int(bound["slices"]), "a slice")
    elif name == "list" and isinstance(text, str):
        _check_items(len(text))
    elif name in ("urlize", "title", "striptags", "wordcount") and isinstance(text, str):
        _check_slow_input(name, text)
    elif name in ("string", "pprint"):
        _check_chars(_weight(text))


_CHECKED_FILTERS = frozenset(
    {
        "center",
        "indent",
        "wordwrap",
        "format",
        "replace",
        "batch",
        "slice",
        "list",
        "string",
        "pprint",
        "urlize",
        "striptags",
        "title",
        "wordcount",
    }
)


def _guard_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(func) if name in _CHECKED_FILTERS else None
    # Jinja's async-aware filters take the evaluation context without declaring it.
    hidden = int(
        _PassArg.from_obj(func) is not None and _PassArg.from_obj(inspect.unwrap(func)) is None
    )

    @functools.wraps(func)  # keeps Jinja's pass_context/pass_environment mark
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _run().step()
        if signature is not None:
            _check_filter(name, signature.bind(*args[hidden:], **kwargs).arguments)
        return _charge(func(*args, **kwargs))

    return guarded


@pass_environment
def _join(env: BoundedSandbox, value: Iterable[Any], d: str = "", attribute: Any = None) -> str:
    if attribute is not None:
        value = map(make_attrgetter(env, attribute), value)
    return bounded_join(str(d), value)


@pass_environment
def _sum(
    env: BoundedSandbox, iterable: Iterable[Any], attribute: Any = None, start: Any = 0
) -> Any:
    if attribute is not None:
        iterable = map(make_attrgetter(env, attribute), iterable)
    total = start
    for item in iterable:
        total = _binop("+", total, item)
    return total


def _tojson(value: Any, indent: int | None = None) -> str:
    _check_chars(_weight(value) * 2)  # \u escapes at most double a string's length
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _bounded_range(*args: int) -> range:
    numbers = range(*args)
    _check_items(len(numbers), "a range()")
    return numbers  # a loop over it is counted step by step (`_Instrument`)


def _steps(iterable: Iterable[Any]) -> Iterator[Any]:
    run = _run()
    for item in iterable:
        run.step()
        yield item


def _binop(operator: str, left: Any, right: Any) -> Any:
    _run().step()
    if operator == "*":
        _check_mul(left, right)
    elif operator == "+":
        _check_add(left, right)
    elif operator == "%" and isinstance(left, str):
        _check_printf(left, right)
    elif operator == "**":
        _check_pow(left, right)
    return _charge(BoundedSandbox.default_binop_table[operator](left, right))


def _call_env(name: str, arg: nodes.Node, lineno: int) -> nodes.Call:
    call = nodes.Call(nodes.EnvironmentAttribute(name), [arg], [], None, None)
    return cast(nodes.Call, call.set_lineno(lineno))


class _Instrument(NodeTransformer):
    """Routes what the sandbox does not intercept through checked calls: loops, `~`, text."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = _call_env("bounded_steps", node.iter, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        items = nodes.List(node.nodes).set_lineno(node.lineno)
        return _call_env("bounded_concat", items, lineno=node.lineno)

    def visit_TemplateData(self, node: nodes.TemplateData) -> nodes.Node:
        # Literal text repeated by a loop inside `{% set %}...{% endset %}` is counted too.
        return _call_env("bounded_text", nodes.Const(node.data), lineno=node.lineno)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"+", "*", "%", "**"})

    def __init__(self, **options: Any) -> None:
        super().__init__(finalize=_charge, **options)
        self.globals["range"] = _bounded_range
        self.globals.pop("lipsum", None)  # lipsum(n) writes n paragraphs in one call
        self.filters.update(join=_join, sum=_sum, tojson=_tojson)
        self.filters = {name: _guard_filter(name, f) for name, f in self.filters.items()}

    def bounded_steps(self, iterable: Iterable[Any]) -> Iterator[Any]:
        return _steps(iterable)

    def bounded_concat(self, items: list[Any]) -> str:
        return bounded_join("", items)

    def bounded_text(self, text: str) -> str:
        return text

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        instrumented = _Instrument().visit(tree)
        instrumented.set_environment(self)
        return instrumented  # type: ignore[no-any-return]

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        return _binop(operator, left, right)

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        _run().step()
        if isinstance(obj, Macro):
            return _charge(super().call(context, obj, *args, **kwargs))
        target = getattr(obj, "__wrapped__", obj)  # the sandbox hands out str.format wrapped
        owner = getattr(target, "__self__", None)
        if isinstance(owner, str):
            name = getattr(target, "__name__", "")
            if name == "join" and args:
                return _charge(bounded_join(owner, args[0]))
            _check_str_method(owner, name, args, kwargs)
        return _charge(super().call(context, obj, *args, **kwargs))

    def getattr(self, obj: Any, attribute: str) -> Any:
        _run().step()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _run().step()
        return super().getitem(obj, argument)

    def unsafe_undefined(self, obj: Any, attribute: str) -> Undefined:
        # Jinja returns an Undefined that prints as ''; a template probing internals stops.
        raise SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
        )
