"""Calibration text that ships with every CPython and is disjoint from the evaluation text.

``qfuse eval`` scores ``pydoc_data.topics`` (the language reference's help topics); calibration
reads the docstrings of a fixed list of standard-library modules, their public functions and
classes and the classes' methods: English technical prose of the same kind, none of it in the
evaluated text. Nothing is downloaded. Like ``pydoc_data.topics``, the text depends on the
Python release (its length is printed by ``qfuse quantize`` / ``qfuse eval``).
"""

from __future__ import annotations

import importlib
import inspect

import torch
from torch import Tensor

# Modules whose docstrings make the text, in this order (all present in CPython 3.10-3.14).
MODULES = (
    "argparse",
    "asyncio",
    "base64",
    "bisect",
    "calendar",
    "collections",
    "configparser",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "email.message",
    "enum",
    "fractions",
    "functools",
    "glob",
    "gzip",
    "hashlib",
    "heapq",
    "hmac",
    "html.parser",
    "http.client",
    "http.server",
    "imaplib",
    "inspect",
    "ipaddress",
    "itertools",
    "json",
    "logging",
    "mailbox",
    "mimetypes",
    "multiprocessing.pool",
    "numbers",
    "operator",
    "optparse",
    "os",
    "pathlib",
    "pickle",
    "pprint",
    "queue",
    "random",
    "re",
    "sched",
    "secrets",
    "selectors",
    "shelve",
    "shlex",
    "shutil",
    "smtplib",
    "socket",
    "socketserver",
    "sqlite3",
    "ssl",
    "statistics",
    "string",
    "struct",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "timeit",
    "tokenize",
    "traceback",
    "typing",
    "unittest.case",
    "urllib.parse",
    "urllib.request",
    "uuid",
    "warnings",
    "wave",
    "weakref",
    "xml.dom.minidom",
    "zipfile",
    "zoneinfo",
)


def _docs(obj, seen: set[int]) -> list[str]:
    doc = inspect.getdoc(obj)
    if not doc or id(doc) in seen:
        return []
    seen.add(id(doc))
    return [doc]


def calibration_text() -> str:
    """Docstrings of :data:`MODULES`, each module's own first, then its public functions and
    classes (and each class's public methods) in name order, joined by blank lines."""
    parts: list[str] = []
    seen: set[int] = set()
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # e.g. a Python built without sqlite3 or ssl
            continue
        parts += _docs(module, seen)
        for attr in sorted(vars(module)):
            obj = vars(module)[attr]
            if attr.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            parts += _docs(obj, seen)
            if inspect.isclass(obj):
                for meth in sorted(vars(obj)):
                    if not meth.startswith("_") and inspect.isfunction(vars(obj)[meth]):
                        parts += _docs(vars(obj)[meth], seen)
    return "\n\n".join(parts)


def calibration_batches(tokenizer, samples: int = 128, window: int = 512, text: str | None = None) -> Tensor:
    """``[samples, window]`` token ids: consecutive windows of ``text`` (default
    :func:`calibration_text`), tokenized without special tokens. Raises ``ValueError`` when
    the text holds fewer than ``samples`` windows."""
    text = calibration_text() if text is None else text
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    n = ids.numel() // window
    if n < samples:
        raise ValueError(f"calibration text has {ids.numel()} tokens: {n} windows of {window}, fewer than the {samples} asked for")
    return ids[: samples * window].reshape(samples, window)
