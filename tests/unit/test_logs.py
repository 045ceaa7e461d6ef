"""The daemon's log lines: klog's text header, or component-base's JSON format
(`--logging-format json`, `logging.format: json`), field for field as
k8s.io/component-base/logs/json writes them (its json_test.go and klog_test.go)."""

from __future__ import annotations

import json
import logging
import os
import re
import sys

import pytest

from ipvsproxy.process import logs

HERE = os.path.join(os.path.dirname(__file__), "test_logs.py")


def _record(level: int, msg: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("invalid namespace:default")
        except ValueError:
            exc_info = sys.exc_info()
    record = logging.LogRecord("ipvsproxy.daemon", level, HERE, 42, msg, args, exc_info)
    record.created = 1_700_000_000.123456
    record.msecs = 123.456
    return record


def _format(log_format: str, record: logging.LogRecord) -> str:
    logs.setup(log_format, 4)
    return logging.getLogger().handlers[0].format(record)


def test_json_info_line_has_component_base_keys_in_order() -> None:
    line = _format("json", _record(logging.INFO, "service %s: synced", "default/web"))
    body = json.loads(line)
    assert list(body) == ["ts", "logger", "caller", "msg", "v"]
    assert body["ts"] == pytest.approx(1_700_000_000_123.456)  # epoch milliseconds, a float
    assert isinstance(body["ts"], float)
    assert body["caller"] == "unit/test_logs.py:42"  # zap's short caller: directory/file:line
    assert body["msg"] == "service default/web: synced"
    assert body["v"] == 0
    assert body["logger"] == "ipvsproxy.daemon"
    assert "\n" not in line


def test_json_debug_is_verbosity_4_and_warning_is_0() -> None:
    """ipvsproxy's debug lines show from -v=4 on, so they are klog's V(4); klog's Warning is an
    Info at V(0) in component-base's JSON (it has no level key)."""
    assert json.loads(_format("json", _record(logging.DEBUG, "quiet")))["v"] == 4
    body = json.loads(_format("json", _record(logging.WARNING, "loud")))
    assert body["v"] == 0 and "level" not in body


def test_json_error_has_no_v_and_carries_the_exception_as_err() -> None:
    body = json.loads(_format("json", _record(logging.ERROR, "wrong namespace", exc=True)))
    assert "v" not in body
    assert body["msg"] == "wrong namespace"
    assert "ValueError: invalid namespace:default" in body["err"]
    assert list(body) == ["ts", "logger", "caller", "msg", "err"]


def test_json_error_without_exception_has_no_err() -> None:
    body = json.loads(_format("json", _record(logging.ERROR, "failed")))
    assert list(body) == ["ts", "logger", "caller", "msg"]


def test_json_key_values_follow_the_message() -> None:
    record = _record(logging.INFO, "test")
    record.kv = {"count": 1, "pod": {"name": "pod-1", "namespace": "kube-system"}}
    body = json.loads(_format("json", record))
    assert list(body)[-3:] == ["v", "count", "pod"]
    assert body["pod"] == {"name": "pod-1", "namespace": "kube-system"}


def test_text_lines_have_klogs_header() -> None:
    """klog: Lmmdd hh:mm:ss.uuuuuu threadid file:line] msg."""
    line = _format("text", _record(logging.WARNING, "service %s: bad", "default/web"))
    m = re.fullmatch(r"W(\d{4}) (\d\d:\d\d:\d\d\.\d{6}) +(\d+) test_logs\.py:42\] (.*)", line)
    assert m, line
    assert m.group(4) == "service default/web: bad"
    assert m.group(2).endswith(".123456")
    assert int(m.group(3)) == os.getpid()


@pytest.mark.parametrize(
    ("level", "letter"),
    [(logging.DEBUG, "I"), (logging.INFO, "I"), (logging.WARNING, "W"), (logging.ERROR, "E"),
     (logging.CRITICAL, "E")],
)  # fmt: skip
def test_text_severity_letters(level: int, letter: str) -> None:
    assert _format("text", _record(level, "x")).startswith(letter)


def test_text_exception_follows_on_the_next_lines() -> None:
    line = _format("text", _record(logging.ERROR, "sync failed", exc=True))
    first, *rest = line.split("\n")
    assert first.endswith("] sync failed")
    assert "ValueError: invalid namespace:default" in rest[-1]
