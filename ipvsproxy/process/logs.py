"""The daemon's log lines, as Kubernetes components write theirs: klog's text header
(``I1205 19:43:28.123456    1234 file.py:42] msg``), or, with ``--logging-format json``,
k8s.io/component-base's JSON format (one object per line: ``ts`` in epoch milliseconds,
``caller``, ``msg``, ``v`` for info lines and ``err`` for errors, then key/values).

A record's key/values are ``extra={"kv": {...}}``; ipvsproxy's debug lines are klog's V(4)
(they show from ``-v=4`` on), and a warning is an info line at V(0), as klog's Warning is in
component-base's JSON (it has no level key)."""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
from typing import Any

DEBUG_V = 4  # the -v at which ipvsproxy's debug lines show


def _caller(record: logging.LogRecord) -> str:
    """zap's short caller: the file's directory and name, and the line."""
    directory = os.path.basename(os.path.dirname(record.pathname))
    return f"{directory}/{record.filename}:{record.lineno}"


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": record.created * 1000.0,
            "logger": record.name,
            "caller": _caller(record),
            "msg": record.getMessage(),
        }
        if record.levelno < logging.ERROR:
            body["v"] = DEBUG_V if record.levelno < logging.INFO else 0
        if record.exc_info:
            body["err"] = self.formatException(record.exc_info)
        for key, value in getattr(record, "kv", {}).items():
            body.setdefault(key, value)
        return json.dumps(body, default=str)


class KlogFormatter(logging.Formatter):
    """klog's header: severity letter, mmdd hh:mm:ss.uuuuuu, the pid in 7 columns, file:line."""

    def format(self, record: logging.LogRecord) -> str:
        letter = "IIWE"[min(3, max(0, record.levelno // 10 - 1))]
        when = datetime.datetime.fromtimestamp(record.created).strftime("%m%d %H:%M:%S.%f")
        line = f"{letter}{when} {record.process or 0:7d} {record.filename}:{record.lineno}] "
        line += record.getMessage()
        kv = getattr(record, "kv", {})
        if kv:
            line += "".join(f" {k}={json.dumps(v, default=str)}" for k, v in kv.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup(log_format: str = "text", verbosity: int = 0) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter() if log_format == "json" else KlogFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbosity >= DEBUG_V else logging.INFO)
    # The client's own chatter only at high verbosity.
    logging.getLogger("urllib3").setLevel(logging.DEBUG if verbosity >= 8 else logging.WARNING)
    logging.getLogger("kubernetes").setLevel(logging.DEBUG if verbosity >= 8 else logging.WARNING)
