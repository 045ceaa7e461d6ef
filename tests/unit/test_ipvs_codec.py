"""Our IPVS message codec against pyroute2's, on the same messages, both directions."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyroute2.netlink.generic.ipvs import ipvsmsg

from ipvsproxy.core.virtual_servers import (
    SVC_F_PERSISTENT,
    DestKey,
    Protocol,
    RealServer,
    ServiceKey,
    VirtualServer,
)
from ipvsproxy.kernel.netlink import codec, ipvs_messages

FAMILY = 0x23
ipv4 = st.ip_addresses(v=4).map(str)
ports = st.integers(1, 65535)
protocols = st.sampled_from(list(Protocol))
schedulers = st.sampled_from(["rr", "wrr", "lc", "wlc", "sh", "mh", "sed", "nq"])


@st.composite
def virtual_servers(draw: st.DrawFn) -> VirtualServer:
    key = ServiceKey(draw(ipv4), draw(protocols), draw(ports))
    persistent = draw(st.booleans())
    return VirtualServer(
        key,
        draw(schedulers),
        SVC_F_PERSISTENT if persistent else 0,
        draw(st.integers(1, 86400)) if persistent else 0,
        draw(st.sampled_from([-1, 32, 24])),
    )


real_servers = st.builds(
    RealServer, st.builds(DestKey, ipv4, ports), st.integers(0, 65535), st.just(0)
)


def decode(data: bytes) -> Any:
    msg = ipvsmsg(data)
    msg.decode()
    return msg


@given(virtual_servers())
def test_new_service_decodes_in_pyroute2(vs: VirtualServer) -> None:
    msg = decode(ipvs_messages.Encoder(FAMILY).new_service(42, vs))
    assert msg["header"]["type"] == FAMILY
    assert msg["header"]["sequence_number"] == 42
    assert msg["cmd"] == ipvs_messages.CMD_NEW_SERVICE
    svc = msg.get_attr("IPVS_CMD_ATTR_SERVICE")
    assert svc.get_attr("IPVS_SVC_ATTR_AF") == socket.AF_INET
    assert svc.get_attr("IPVS_SVC_ATTR_PROTOCOL") == vs.key.protocol.number
    assert svc.get_attr("IPVS_SVC_ATTR_ADDR") == vs.key.address
    assert svc.get_attr("IPVS_SVC_ATTR_PORT") == vs.key.port
    assert svc.get_attr("IPVS_SVC_ATTR_SCHED_NAME") == vs.scheduler
    assert svc.get_attr("IPVS_SVC_ATTR_FLAGS")["flags"] == vs.flags
    assert svc.get_attr("IPVS_SVC_ATTR_TIMEOUT") == vs.timeout
    mask = svc.get_attr("IPVS_SVC_ATTR_NETMASK")
    assert sum(bin(int(o)).count("1") for o in mask.split(".")) == vs.prefix_len


@given(virtual_servers(), real_servers)
def test_dest_messages_decode_in_pyroute2(vs: VirtualServer, rs: RealServer) -> None:
    enc = ipvs_messages.Encoder(FAMILY)
    for cmd, data in (
        (ipvs_messages.CMD_NEW_DEST, enc.new_dest(1, vs.key, rs)),
        (ipvs_messages.CMD_SET_DEST, enc.set_dest(2, vs.key, rs)),
        (ipvs_messages.CMD_DEL_DEST, enc.del_dest(3, vs.key, rs.key)),
    ):
        msg = decode(data)
        assert msg["cmd"] == cmd
        svc = msg.get_attr("IPVS_CMD_ATTR_SERVICE")
        assert svc.get_attr("IPVS_SVC_ATTR_ADDR") == vs.key.address
        assert svc.get_attr("IPVS_SVC_ATTR_PORT") == vs.key.port
        dest = msg.get_attr("IPVS_CMD_ATTR_DEST")
        assert dest.get_attr("IPVS_DEST_ATTR_ADDR") == rs.key.address
        assert dest.get_attr("IPVS_DEST_ATTR_PORT") == rs.key.port
        if cmd != ipvs_messages.CMD_DEL_DEST:
            assert dest.get_attr("IPVS_DEST_ATTR_WEIGHT") == rs.weight
            assert dest.get_attr("IPVS_DEST_ATTR_FWD_METHOD") == 0  # masquerade


def pyroute2_service_reply(vs: VirtualServer) -> bytes:
    mask = (0xFFFFFFFF << (32 - vs.prefix_len)) & 0xFFFFFFFF
    msg = ipvsmsg()
    msg["cmd"] = ipvs_messages.CMD_NEW_SERVICE
    msg["version"] = 1
    msg["header"]["type"] = FAMILY
    msg["attrs"] = [
        (
            "IPVS_CMD_ATTR_SERVICE",
            {
                "attrs": [
                    ("IPVS_SVC_ATTR_AF", socket.AF_INET),
                    ("IPVS_SVC_ATTR_PROTOCOL", vs.key.protocol.number),
                    ("IPVS_SVC_ATTR_ADDR", vs.key.address),
                    ("IPVS_SVC_ATTR_PORT", vs.key.port),
                    ("IPVS_SVC_ATTR_SCHED_NAME", vs.scheduler),
                    ("IPVS_SVC_ATTR_FLAGS", {"flags": vs.flags | 0x2, "mask": 0xFFFFFFFF}),
                    ("IPVS_SVC_ATTR_TIMEOUT", vs.timeout),
                    ("IPVS_SVC_ATTR_NETMASK", socket.inet_ntoa(mask.to_bytes(4, "big"))),
                ]
            },
        )
    ]
    msg.encode()
    return bytes(msg.data)


@given(virtual_servers())
def test_pyroute2_service_messages_parse_here(vs: VirtualServer) -> None:
    (msg,) = codec.messages(pyroute2_service_reply(vs))
    parsed = ipvs_messages.parse_service(msg)
    assert parsed is not None
    assert parsed.key == vs.key
    assert vs.same_settings(parsed)  # the kernel's HASHED flag is not a difference


@given(virtual_servers(), real_servers, st.integers(0, 1000), st.integers(0, 1000))
def test_pyroute2_dest_messages_parse_here(
    vs: VirtualServer, rs: RealServer, active: int, inactive: int
) -> None:
    msg = ipvsmsg()
    msg["cmd"] = ipvs_messages.CMD_NEW_DEST
    msg["version"] = 1
    msg["attrs"] = [
        (
            "IPVS_CMD_ATTR_DEST",
            {
                "attrs": [
                    ("IPVS_DEST_ATTR_ADDR_FAMILY", socket.AF_INET),
                    ("IPVS_DEST_ATTR_ADDR", rs.key.address),
                    ("IPVS_DEST_ATTR_PORT", rs.key.port),
                    ("IPVS_DEST_ATTR_FWD_METHOD", 0),
                    ("IPVS_DEST_ATTR_WEIGHT", rs.weight),
                    ("IPVS_DEST_ATTR_ACTIVE_CONNS", active),
                    ("IPVS_DEST_ATTR_INACT_CONNS", inactive),
                ]
            },
        )
    ]
    msg.encode()
    (raw,) = codec.messages(bytes(msg.data))
    parsed = ipvs_messages.parse_dest(raw, socket.AF_INET)
    assert parsed is not None
    assert parsed.server == rs
    assert (parsed.stats.active, parsed.stats.inactive) == (active, inactive)


@given(st.lists(st.tuples(virtual_servers(), real_servers), min_size=1, max_size=6))
def test_new_dest_is_set_dest_but_for_its_command(
    pairs: list[tuple[VirtualServer, RealServer]],
) -> None:
    """new_dest packs its message in one go (the cold sync's hot path); the bytes are those of
    the composed encoding set_dest uses, but for the command, whatever key came before."""
    enc, ref = ipvs_messages.Encoder(FAMILY), ipvs_messages.Encoder(FAMILY)
    for seq, (vs, rs) in enumerate(pairs + pairs[::-1]):
        new, composed = enc.new_dest(seq, vs.key, rs), ref.set_dest(seq, vs.key, rs)
        assert new[16] == ipvs_messages.CMD_NEW_DEST and composed[16] == ipvs_messages.CMD_SET_DEST
        assert new[:16] == composed[:16] and new[17:] == composed[17:]


@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_config_reply_parses_to_its_timeouts(tcp: int, tcp_fin: int, udp: int) -> None:
    """The kernel answers GET_CONFIG with the attributes SET_CONFIG carries."""
    reply = ipvs_messages.Encoder(FAMILY).set_config(7, tcp, tcp_fin, udp)
    (msg,) = codec.messages(reply)
    assert ipvs_messages.parse_config(msg) == (tcp, tcp_fin, udp)


def test_config_reply_without_a_timeout_is_an_error() -> None:
    body = codec.attr_u32(ipvs_messages.ATTR_TIMEOUT_TCP, 900)
    (msg,) = codec.messages(codec.genl_message(FAMILY, ipvs_messages.CMD_SET_CONFIG, 1, 7, 0, body))
    with pytest.raises(ValueError, match="without timeout attribute"):
        ipvs_messages.parse_config(msg)


def test_get_config_decodes_in_pyroute2() -> None:
    msg = decode(ipvs_messages.Encoder(FAMILY).get_config(9))
    assert msg["cmd"] == ipvs_messages.CMD_GET_CONFIG and msg["header"]["sequence_number"] == 9
