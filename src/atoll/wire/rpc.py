"""Client stubs and server registration for atoll.proto's services.

The services are listed here as atoll.proto declares them (tests/unit/wire/test_messages.py
checks this table against the proto's descriptors). What differs from grpc_tools' generated
`_pb2_grpc` code: messages of type `Frame` pass as raw bytes (wire/frames.py), so payload bytes
are never parsed or re-serialized, and the other messages are wire/messages.py's classes, so no
process of atoll loads the protobuf runtime.
"""

from __future__ import annotations

from typing import Any

import grpc

from atoll.wire import messages

PACKAGE = "atoll.v1"
RAW = "Frame"

# service -> method -> (request type, response type, client streams, server streams)
SERVICES: dict[str, dict[str, tuple[str, str, bool, bool]]] = {
    "Federation": {
        "Connect": ("SiteEvent", "ServerCommand", True, True),
        "FetchJob": ("JobRef", RAW, False, True),
        "PullTask": ("PullRequest", RAW, False, True),
        "PushReply": (RAW, "Json", True, False),
        "Tasks": (RAW, RAW, True, True),  # one job's pulls and replies on one call
        "Report": ("Json", "Json", False, False),
    },
    "Admin": {
        "Call": ("Json", "Json", False, False),
        "Submit": (RAW, "Json", True, False),
        "Download": ("Json", RAW, False, True),
    },
    "WorkerLink": {
        "Register": ("Json", "Json", False, False),
        "FetchApp": ("Json", RAW, False, True),
        "SendTask": (RAW, "Json", True, False),
        "NextReply": ("PullRequest", RAW, False, True),
        "NextTask": ("PullRequest", RAW, False, True),
        "SendReply": (RAW, "Json", True, False),
        "Report": ("Json", "Json", False, False),
        "Finish": ("Json", "Json", False, False),
        "SpendBudget": ("Json", "Json", False, False),  # a site worker, before each DP release
        "SendResults": (RAW, "Json", True, False),  # a Pod's results/, before Finish
        "SendCheckpoint": (RAW, "Json", True, False),  # a Pod's server worker, each round
        "FetchCheckpoint": ("Json", RAW, False, True),  # ... resumed after a server restart
    },
}

_KINDS = {  # (client_streaming, server_streaming) -> (channel factory, handler factory)
    (False, False): ("unary_unary", grpc.unary_unary_rpc_method_handler),
    (False, True): ("unary_stream", grpc.unary_stream_rpc_method_handler),
    (True, False): ("stream_unary", grpc.stream_unary_rpc_method_handler),
    (True, True): ("stream_stream", grpc.stream_stream_rpc_method_handler),
}


def _codec(type_name: str) -> tuple[Any, Any]:
    """(serializer, deserializer) for one message type; None, None keeps it raw bytes."""
    if type_name == RAW:
        return None, None
    cls = getattr(messages, type_name)
    return cls.SerializeToString, cls.FromString


def _methods(service: str):
    for name, (request, response, client_streams, server_streams) in SERVICES[service].items():
        kind = _KINDS[(client_streams, server_streams)]
        yield name, request, response, f"/{PACKAGE}.{service}/{name}", kind


class Stub:
    """Callables named like the service's methods, e.g. `stub(channel, "Admin").Call(...)`."""

    def __init__(self, channel: grpc.Channel, service: str):
        for name, request, response, path, (factory, _) in _methods(service):
            request_out, _ = _codec(request)
            _, response_in = _codec(response)
            call = getattr(channel, factory)(path, request_serializer=request_out,
                                             response_deserializer=response_in)
            setattr(self, name, call)


def stub(channel: grpc.Channel, service: str) -> Any:
    return Stub(channel, service)


def add_servicer(server: grpc.Server, service: str, servicer: object) -> None:
    """Serve `service` with servicer's methods of the same names."""
    handlers = {}
    for name, request, response, _, (_, handler) in _methods(service):
        _, request_in = _codec(request)
        response_out, _ = _codec(response)
        handlers[name] = handler(getattr(servicer, name), request_deserializer=request_in,
                                 response_serializer=response_out)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(f"{PACKAGE}.{service}", handlers),))
