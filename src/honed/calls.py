"""src/honed/calls.py: one spelling per call: samples and calls bound to forward's signature.

``m(x, y, 0.5)``, ``m(x, y=y, scale=0.5)`` and ``m(x=x, y=y, scale=0.5)`` are one call. Before a
call's signature key is made (when recording and when dispatching), it is bound to the module's
``forward`` signature and rewritten in one canonical form, so every spelling maps to one graph:

- parameters that may be passed by position are passed by position, in signature order, with
  their defaults filled in when left out;
- ``*args`` follow them; keyword-only parameters are keywords in signature order (defaults
  filled in), then ``**kwargs`` sorted by name.

The signature is that of the callable itself, not of what a decorator wraps: a forward wrapped
as ``wrapper(*args, **kwargs)`` (transformers' models) keeps each call's spelling, with its
keywords sorted by name.

A dataset sample is read as follows (``split_sample``):

- a ``honed.backend.Sample(args, kwargs)``, or a tuple of exactly two items whose first is a
  tuple and whose second is a dict with string keys: ``(args, kwargs)``;
- any other tuple: positional arguments;
- a dict: keyword arguments;
- anything else (a tensor, a list, ...): the single positional argument.

So a call whose two positional arguments really are a tuple and a dict is written
``((the_tuple, the_dict), {})`` (or ``Sample((the_tuple, the_dict), {})``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from honed.backend.base import Sample

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def split_sample(sample: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The positional and keyword arguments one dataset sample stands for (see the module doc)."""
    if isinstance(sample, tuple):
        if (
            len(sample) == 2
            and isinstance(sample[0], tuple)
            and isinstance(sample[1], dict)
            and all(isinstance(k, str) for k in sample[1])
        ):
            return tuple(sample[0]), dict(sample[1])
        return tuple(sample), {}
    if isinstance(sample, dict):
        return (), dict(sample)
    return (sample,), {}


def call_sample(func: Callable[..., Any], sample: Any) -> Any:
    """``func`` called on one dataset sample."""
    args, kwargs = split_sample(sample)
    return func(*args, **kwargs)


def as_sample(sample: Any) -> Sample:
    """One dataset sample as a ``Sample(args, kwargs)``."""
    return Sample(*split_sample(sample))


class CallBinder:
    """Rewrites every spelling of a call of ``fn`` into one canonical ``(args, kwargs)``.

    ``arity`` is the number of positional arguments for which a call without keywords is
    already canonical (the caller may skip ``bind`` then); -1 when no such call exists.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.arity = -1
        try:
            # The signature of what is called: a decorated forward (transformers wraps its
            # models' forward in (*args, **kwargs) wrappers that read keywords) keeps its
            # spelling, only its keywords sorted; binding to the inner signature would turn
            # keywords the wrapper looks for into positions it does not.
            self._sig: inspect.Signature | None = inspect.signature(fn, follow_wrapped=False)
        except (TypeError, ValueError):  # no signature to read (a builtin): calls stay as given
            self._sig = None
            return
        params = list(self._sig.parameters.values())
        positional = [p for p in params if p.kind in _POSITIONAL]
        required = [p for p in positional if p.default is inspect.Parameter.empty]
        self._n_pos = len(positional)
        # Only trailing parameters can be left out of a positional call.
        self._n_required = max(
            (i + 1 for i, p in enumerate(positional) if p in required), default=0
        )
        self._tail = tuple(p.default for p in positional[self._n_required :])
        kwonly = [p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
        self._kw_required = any(p.default is inspect.Parameter.empty for p in kwonly)
        self._kw_defaults = {p.name: p.default for p in kwonly}
        self._var_pos = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
        if not kwonly:
            self.arity = self._n_pos

    def bind(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The canonical form of ``f(*args, **kwargs)``; a call that does not bind stays as given
        (calling the module then raises its own error)."""
        if self._sig is None:
            return args, kwargs
        if not kwargs and not self._kw_required:
            n = len(args)
            defaults = dict(self._kw_defaults) if self._kw_defaults else kwargs
            if n == self._n_pos or (n > self._n_pos and self._var_pos):
                return args, defaults
            if self._n_required <= n < self._n_pos:
                return args + self._tail[n - self._n_required :], defaults
        return self._bind_slow(args, kwargs)

    def _bind_slow(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        assert self._sig is not None
        try:
            bound = self._sig.bind(*args, **kwargs)
        except TypeError:
            return args, kwargs
        bound.apply_defaults()
        positional: list[Any] = []
        keywords: dict[str, Any] = {}
        for name, param in self._sig.parameters.items():
            value = bound.arguments[name]
            if param.kind in _POSITIONAL:
                positional.append(value)
            elif param.kind is inspect.Parameter.VAR_POSITIONAL:
                positional.extend(value)
            elif param.kind is inspect.Parameter.KEYWORD_ONLY:
                keywords[name] = value
            else:  # **kwargs: sorted, so their order in the call does not matter
                keywords.update(sorted(value.items()))
        return tuple(positional), keywords
