"""Every public and internal RPC fed hostile bytes: protobuf wire messages that hypothesis
builds from each request's descriptor, field by field (empty, huge, invalid UTF-8, out-of-range
and negative numbers, NaN, unknown enum values, wrong wire types, trailing garbage), with
deadlines from 0 up. Every reply is a well-formed status, never UNKNOWN or INTERNAL, never a
traceback; and afterwards the server answers as before, its index unchanged."""

from __future__ import annotations

import asyncio
import struct
from collections import Counter
from collections.abc import Callable

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragline.v1 import ragline_pb2, ragline_pb2_grpc, stages_pb2
from services.server import RunningServer
from tests.reliability.conftest import scale

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

EXAMPLES = scale(300, 3000)
GENERATING = {"Answer", "AnswerStream", "Generate", "GenerateStream"}
REFUSED = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative numbers as protobuf writes them: ten bytes
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def length_delimited(number: int, payload: bytes) -> bytes:
    return tag(number, 2) + varint(len(payload)) + payload


NUMBERS = st.one_of(
    st.integers(-(2**63), 2**64 - 1),
    st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31), 2**32, 2**63 - 1, 10**12]),
)
TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", "frobnicator", "../../etc/passwd", "/etc/shadow", "\x00", "默认"]),
    st.binary(max_size=40).map(lambda b: b"\xff\xfe" + b),  # not UTF-8
    st.integers(10_000, 600_000).map(lambda n: b"q" * n),  # huge
)


def value_of(field: FieldDescriptor, depth: int) -> st.SearchStrategy[bytes]:
    """One occurrence of ``field`` on the wire: usually its own type, sometimes another."""
    number, kind = field.number, field.type
    if kind == FieldDescriptor.TYPE_MESSAGE and field.message_type is not None:
        own = message_of(field.message_type, depth + 1).map(lambda b: length_delimited(number, b))
    elif kind in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
        own = TEXT.map(
            lambda v: length_delimited(number, v.encode("utf-8") if isinstance(v, str) else v)
        )
    elif kind in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_FIXED32):
        own = st.floats(width=32).map(lambda f: tag(number, 5) + struct.pack("<f", f))
    elif kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FIXED64):
        own = st.floats().map(lambda f: tag(number, 1) + struct.pack("<d", f))
    else:  # ints, bools, enums: any varint, unknown enum values included
        own = NUMBERS.map(lambda n: tag(number, 0) + varint(n))
    wrong = st.sampled_from(
        [tag(number, 0) + b"\x01", length_delimited(number, b"\x08\x96\x01"), tag(number, 5)]
    )
    return st.one_of(own, own, own, wrong)


def message_of(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[bytes]:
    if depth > 2 or not descriptor.fields:
        return st.just(b"")
    fields = st.lists(
        st.sampled_from(list(descriptor.fields)), max_size=min(6, len(descriptor.fields))
    )

    @st.composite
    def build(draw: Callable) -> bytes:
        chosen = draw(fields)
        parts = [draw(value_of(f, depth)) for f in chosen for _ in range(draw(st.integers(1, 2)))]
        if depth == 0 and draw(st.integers(0, 9)) == 0:
            parts.append(draw(st.binary(min_size=1, max_size=12)))  # trailing garbage
        return b"".join(parts)

    return build()


def methods(server: RunningServer) -> list[tuple[int, MethodDescriptor]]:
    assert server.internal is not None
    public = ragline_pb2.DESCRIPTOR.services_by_name["Ragline"]
    found = [(server.port, m) for m in public.methods]
    for service in stages_pb2.DESCRIPTOR.services_by_name.values():
        found += [(server.internal.port, m) for m in service.methods]
    return found


def fuzz(server: RunningServer, tally: Counter[str]) -> None:
    """The hypothesis run, from a worker thread with blocking channels (the server's event
    loop serves meanwhile)."""
    targets = methods(server)
    channels = {port: grpc.insecure_channel(f"127.0.0.1:{port}") for port, _ in targets}

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data())
    def one(data: st.DataObject) -> None:
        port, method = data.draw(st.sampled_from(targets))
        body = data.draw(message_of(method.input_type))
        timeout = data.draw(st.sampled_from([0.0, 0.001, 0.05, 2.0, 5.0]))
        if method.name in GENERATING:
            timeout = min(timeout, 1.5)
        path = f"/{method.containing_service.full_name}/{method.name}"
        channel = channels[port]
        try:
            if method.server_streaming:
                call = channel.unary_stream(path)
                for n, _ in enumerate(call(body, timeout=timeout)):
                    if n > 20:
                        break
            else:
                channel.unary_unary(path)(body, timeout=timeout)
            code = grpc.StatusCode.OK
            details = ""
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
        tally[f"{method.name} {code.name}"] += 1
        tally["inputs"] += 1
        assert code not in REFUSED, (path, body[:200], code, details)
        assert "Traceback" not in details and 'File "' not in details, details

    try:
        one()
    finally:
        for channel in channels.values():
            channel.close()


async def test_every_rpc_answers_hostile_bytes_with_a_clear_status(server: RunningServer) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = ragline_pb2_grpc.RaglineStub(channel)
        before = await stub.GetStats(ragline_pb2.GetStatsRequest(), timeout=10)
        tally: Counter[str] = Counter()
        await asyncio.to_thread(fuzz, server, tally)
        assert tally["inputs"] >= EXAMPLES
        print("\ngRPC fuzz:", tally["inputs"], "inputs;", dict(sorted(tally.items())))
        # The server is no worse: it answers, and its index is what it was.
        found = await stub.Retrieve(
            ragline_pb2.RetrieveRequest(query="frobctl install prefix"), timeout=30
        )
        assert found.hits and found.hits[0].chunk.doc_id == "frob-manual"
        after = await stub.GetStats(ragline_pb2.GetStatsRequest(), timeout=10)
        assert (after.documents, after.chunks) == (before.documents, before.chunks)
