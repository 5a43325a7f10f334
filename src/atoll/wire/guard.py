"""Serving a service so that every call is admitted before a byte of its request is read, and
every read of a request has a deadline.

gRPC reads a unary request before it runs the handler, and a threaded handler of a streaming
call blocks a thread on each read with no deadline: seventy silent `Admin.Submit` streams held
every handler thread of the server. So each method here is registered as request-streaming
(the same bytes on the wire as a unary request: a client cannot tell), and its wrapper:

1. awaits `admit(context, method)` on the event loop: who the caller is, whether its
   certificate may make this call, the per-peer limits. It aborts the call or returns the
   release to call when the call ends;
2. reads the request on the loop, each message within its deadline (`Deadlines`); a message
   that does not decode is INVALID_ARGUMENT, a silent client DEADLINE_EXCEEDED;
3. runs the servicer's method: `async` ones on the loop, plain ones on the handler threads,
   which then read the rest of a stream through the loop, with the same deadlines.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc

from atoll.spec.errors import EXIT_CONNECTION, EXIT_INVALID, AtollError
from atoll.wire import messages, rpc

Admit = Callable[[Any, str], Awaitable[Callable[[], None]]]
_EOF = grpc.aio.EOF
_DONE = object()


@dataclass(frozen=True)
class Deadlines:
    first_s: float = 10.0  # the request, or a stream's first message, after the call starts
    next_s: float = 30.0  # each later message of a stream


class Stalled(AtollError):
    """The client sent nothing within a read deadline."""

    exit_code = EXIT_CONNECTION


class BadMessage(AtollError):
    """A request message that does not decode as its type."""

    exit_code = EXIT_INVALID


def _decoder(type_name: str) -> Callable[[bytes], Any]:
    if type_name == rpc.RAW:
        return _raw  # frames stay as received: no copy
    cls = getattr(messages, type_name)

    def decode(raw: bytes) -> Any:
        try:
            return cls.FromString(raw)
        except (messages.DecodeError, TypeError) as exc:
            raise BadMessage(f"the request is not a valid {rpc.PACKAGE}.{type_name}: "
                             f"{exc}") from None
    return decode


def _raw(data: bytes) -> bytes:
    return data


def _encoder(type_name: str) -> Callable[[Any], bytes] | None:
    return None if type_name == rpc.RAW else getattr(messages, type_name).SerializeToString


class Reader:
    """A call's request messages, read on the loop, each within its deadline; async-iterable."""

    def __init__(self, context, decode: Callable[[bytes], Any], deadlines: Deadlines):
        self.context, self.decode, self.deadlines = context, decode, deadlines
        self.count = 0

    async def next(self) -> Any:
        """The next message, or grpc.aio.EOF at the end of the stream."""
        first = self.count == 0
        timeout = self.deadlines.first_s if first else self.deadlines.next_s
        try:
            async with asyncio.timeout(timeout):  # a timer, not a task per message
                raw = await self.context.read()
        except TimeoutError:
            what = "the request" if first else "the next message of the stream"
            raise Stalled(f"the server received nothing for {timeout:g} s while it waited for "
                          f"{what}; send it without pausing") from None
        if raw is _EOF:
            return _EOF
        self.count += 1
        return self.decode(raw)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        item = await self.next()
        if item is _EOF:
            raise StopAsyncIteration
        return item

    def blocking(self, loop: asyncio.AbstractEventLoop, first: Any = _DONE) -> Iterator[Any]:
        """The same messages for a handler on a thread (`first`: one read already)."""
        if first is not _DONE:
            yield first
        while (item := asyncio.run_coroutine_threadsafe(self.next(), loop).result()) is not _EOF:
            yield item


class ThreadContext:
    """What a plain handler on a thread sees of its call's (asyncio) context."""

    def __init__(self, context, loop: asyncio.AbstractEventLoop):
        self._context, self._loop = context, loop

    def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        # the loop sends the status; the AbortError it raises comes back here, as grpc's own
        # threaded context does it
        asyncio.run_coroutine_threadsafe(self._context.abort(code, details), self._loop).result()

    def __getattr__(self, name: str) -> Any:  # auth_context, invocation_metadata, peer...
        return getattr(self._context, name)


class Method:
    def __init__(self, name: str, fn: Callable, request: str, response: str,
                 client_streams: bool, admit: Admit, deadlines: Deadlines,
                 pool: futures.Executor):
        self.name, self.fn, self.admit, self.deadlines = name, fn, admit, deadlines
        self.decode = _decoder(request)
        self.encode = _encoder(response)
        self.client_streams = client_streams
        self.pool = pool
        self.on_loop = inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)

    async def _request(self, context, loop) -> tuple[Any, Any]:
        """(what the handler takes as its request, its context)."""
        reader = Reader(context, self.decode, self.deadlines)
        if not self.client_streams:
            request = await reader.next()
            if request is _EOF:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    "the call ended without a request message")
            return request, (context if self.on_loop else ThreadContext(context, loop))
        if self.on_loop:
            return reader, context
        # a thread reads on only after the first message came, so a silent stream holds none
        first = await reader.next()
        messages_ = reader.blocking(loop, first) if first is not _EOF else iter(())
        return messages_, ThreadContext(context, loop)

    @staticmethod
    async def _refuse(context, exc: Exception) -> None:
        code = (grpc.StatusCode.DEADLINE_EXCEEDED if isinstance(exc, Stalled)
                else grpc.StatusCode.INVALID_ARGUMENT)
        await context.abort(code, str(exc))

    async def unary(self, _requests, context) -> Any:
        release = await self.admit(context, self.name)
        loop = asyncio.get_running_loop()
        try:
            request, ctx = await self._request(context, loop)
            if self.on_loop:
                return await self.fn(request, ctx)
            return await loop.run_in_executor(self.pool, self.fn, request, ctx)
        except (Stalled, BadMessage) as exc:
            await self._refuse(context, exc)
        finally:
            release()

    async def stream(self, _requests, context) -> AsyncIterator[Any]:
        release = await self.admit(context, self.name)
        loop = asyncio.get_running_loop()
        answers = None
        try:
            request, ctx = await self._request(context, loop)
            if self.on_loop:
                async for item in self.fn(request, ctx):
                    yield item
                return
            answers = await loop.run_in_executor(self.pool, self.fn, request, ctx)
            # each answer is made on a thread and written from the loop: a slow reader waits
            # on flow control without holding a thread
            while (item := await loop.run_in_executor(self.pool, next, answers, _DONE)) \
                    is not _DONE:
                yield item
        except (Stalled, BadMessage) as exc:
            await self._refuse(context, exc)
        finally:
            release()
            if answers is not None and hasattr(answers, "close"):
                try:
                    answers.close()  # its cleanup (temporary files) runs now, not at GC
                except ValueError:  # still running on its thread; it ends with the call
                    pass

    def handler(self, server_streams: bool) -> grpc.RpcMethodHandler:
        if server_streams:
            return grpc.stream_stream_rpc_method_handler(self.stream,
                                                         response_serializer=self.encode)
        return grpc.stream_unary_rpc_method_handler(self.unary, response_serializer=self.encode)


def guarded_handlers(service: str, servicer: object, admit: Admit,
                     pool: futures.Executor, deadlines: dict[str, Deadlines] | None = None
                     ) -> grpc.GenericRpcHandler:
    """The generic handler that serves `service` (as wire/rpc.py's table declares it) with
    servicer's methods of the same names, each call admitted and read as above."""
    handlers = {}
    for name, (request, response, client_streams, server_streams) in \
            rpc.SERVICES[service].items():
        method = Method(name, getattr(servicer, name), request, response, client_streams,
                        admit, (deadlines or {}).get(name, Deadlines()), pool)
        handlers[name] = method.handler(server_streams)
    return grpc.method_handlers_generic_handler(f"{rpc.PACKAGE}.{service}", handlers)
