"""A TEST DOUBLE: a fault-injecting TCP proxy between kura and a real SeaweedFS S3 gateway.

SeaweedFS cannot be told to throttle or fail, so this proxy, on 127.0.0.1 with an OS-chosen
port, forwards connections byte for byte (``mode = "pass"``; SigV4 signatures stay valid since
the Host header is untouched) or, per new request, answers it itself:

* ``"slowdown"``: ``503 SlowDown`` with S3's XML error body (what S3 sends when throttling:
  https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html);
* ``"error500"``: ``500 InternalError``;
* ``"hang"``: reads the request and never answers (an upload or read timeout);
* ``"refuse"``: closes the connection at once.

The request body is read (by Content-Length) before a fault answer, so the client sees the
status, not a reset. ``faults_answered`` counts requests answered with a fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

FAULT_BODIES = {
    "slowdown": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    "error500": (
        500,
        "Internal Server Error",
        "InternalError",
        "We encountered an internal error.",
    ),
}


class FaultProxy:
    """See module docstring. ``start()`` runs it in a background thread; ``stop()`` ends it."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.mode = "pass"
        self.port = 0
        self.faults_answered = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._piped: set[asyncio.StreamWriter] = set()
        self._open: set[asyncio.StreamWriter] = set()  # every writer, aborted at stop

    def set_mode(self, mode: str) -> None:
        """Switch to ``mode`` and cut every forwarded connection, so pooled keep-alive
        connections cannot bypass the new mode."""
        assert mode in ("pass", "hang", "refuse", *FAULT_BODIES), mode
        self.mode = mode

        def cut() -> None:
            for w in list(self._piped):
                w.transport.abort()
            self._piped.clear()

        self._loop.call_soon_threadsafe(cut)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        fut.result(10)
        return self

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._open):
                w.transport.abort()
            self._closing.set()  # hanging handlers return (cancelling them upsets asyncio.streams)
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            await asyncio.wait(tasks, timeout=5) if tasks else None

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _listen(self) -> None:
        self._closing = asyncio.Event()
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open.add(writer)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        mode = self.mode
        if mode == "pass":
            await self._forward(head, reader, writer)
            return
        with contextlib.suppress(Exception):
            await self._drain_body(head, reader)
            if mode == "refuse":
                writer.transport.abort()
                return
            if mode == "hang":
                self.faults_answered += 1
                await self._closing.wait()
                return
            status, reason, code, message = FAULT_BODIES[mode]
            body = (
                '<?xml version="1.0" encoding="UTF-8"?>\n'
                f"<Error><Code>{code}</Code><Message>{message}</Message></Error>"
            ).encode()
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            self.faults_answered += 1
            await writer.drain()
        writer.close()

    @staticmethod
    async def _drain_body(head: bytes, reader: asyncio.StreamReader) -> None:
        for line in head.decode("latin-1").split("\r\n"):
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                await reader.readexactly(int(value.strip()))

    async def _forward(
        self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Pipe this connection to the upstream both ways until either side closes. Keep-alive
        requests after the first on this connection are forwarded too (``set_mode`` cuts them)."""
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self._open.add(up_writer)
        up_writer.write(head)
        self._piped.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(256 * 1024):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(Exception):
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._piped.discard(writer)
        self._piped.discard(up_writer)
