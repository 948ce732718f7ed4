import asyncio
import itertools
import json
import logging

from starlette.websockets import WebSocketDisconnect

from glmrt.serve.api_error import ApiError, server_error
from glmrt.serve.request_body import decode_json_text
from glmrt.serve.responses_output import ResponsesEventWriter
from glmrt.serve.responses_request import parse_responses_request
from glmrt.serve.responses_session import expand_previous_response, remember_response

log = logging.getLogger("glmrt.serve.ws_session")

CLIENT_EVENT_TYPES = ("response.create", "response.cancel")
SESSION_NUMBERS = itertools.count(1)


class SendDeadlineExceeded(Exception):
    pass


def protocol_of(websocket):
    return getattr(websocket._receive, "__self__", None)


def transport_of(websocket):
    return getattr(protocol_of(websocket), "transport", None)


def writable_event_of(websocket):
    writable = getattr(protocol_of(websocket), "writable", None)
    return writable if isinstance(writable, asyncio.Event) else None


def encode(event):
    return json.dumps(event, ensure_ascii=False, separators=(",", ":"))


class ResponsesSocket:
    def __init__(self, websocket, runtime, send_timeout, max_frame_bytes):
        self.websocket = websocket
        self.runtime = runtime
        self.send_timeout = send_timeout
        self.max_frame_bytes = max_frame_bytes
        self.responses = {}
        self.owner = f"ws:{next(SESSION_NUMBERS)}"
        self.writable = writable_event_of(websocket)
        self.aborted = False
        self.closed = False

    async def serve(self):
        try:
            while not self.aborted:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                await self.dispatch(message)
        except (WebSocketDisconnect, SendDeadlineExceeded, RuntimeError):
            pass
        finally:
            self.closed = True
            await self.cancel_responses()

    async def cancel_responses(self):
        entries = list(self.responses.values())
        for _, task in entries:
            task.cancel()
        if entries:
            await asyncio.gather(*(task for _, task in entries), return_exceptions=True)
        for generation, _ in entries:
            generation.abandon()
            generation.close()
        self.responses.clear()

    async def finish_responses(self):
        tasks = [task for _, task in self.responses.values()]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def abort(self):
        if self.aborted:
            return
        self.aborted = True
        log.warning("send deadline of %.3fs exceeded; closing the WebSocket from %s", self.send_timeout,
                    self.websocket.client)
        try:
            async with asyncio.timeout(self.send_timeout):
                await self.websocket.close(1011)
            return
        except Exception:
            pass
        transport = transport_of(self.websocket)
        if transport is not None:
            transport.abort()

    async def send(self, event):
        if self.aborted or self.closed:
            raise SendDeadlineExceeded()
        text = encode(event)
        if self.writable is not None and self.writable.is_set():
            await self.websocket.send_text(text)
            return
        try:
            async with asyncio.timeout(self.send_timeout):
                await self.websocket.send_text(text)
        except TimeoutError:
            asyncio.ensure_future(self.abort())
            raise SendDeadlineExceeded() from None

    async def send_error(self, error, response_id=None):
        self.runtime.metrics.count_error(error.code)
        event = {"type": "error", "sequence_number": 0, "code": error.code, "message": error.message,
                 "param": error.param, "error": error.body()["error"]}
        if error.event_id is not None:
            event["event_id"] = error.event_id
        if response_id is not None:
            event["response_id"] = response_id
        await self.send(event)

    def parse_frame(self, message):
        if message.get("text") is None:
            raise ApiError("binary_frame_unsupported", "binary frames are not supported; send JSON text frames")
        if len(message["text"]) > self.max_frame_bytes:
            raise ApiError("request_too_large", f"the frame is larger than {self.max_frame_bytes} bytes")
        frame = decode_json_text(message["text"])
        event_id = frame.get("event_id") if isinstance(frame.get("event_id"), str) else None
        frame_type = frame.get("type")
        if frame_type not in CLIENT_EVENT_TYPES:
            raise ApiError("unknown_event_type", f"unknown event type {frame_type!r}; expected one of "
                           f"{', '.join(CLIENT_EVENT_TYPES)}", param="type", event_id=event_id)
        return frame_type, frame, event_id

    async def dispatch(self, message):
        try:
            frame_type, frame, event_id = self.parse_frame(message)
            if frame_type == "response.cancel":
                self.cancel(frame, event_id)
            else:
                await self.create(frame, event_id)
        except ApiError as error:
            await self.send_error(error)
        except (SendDeadlineExceeded, WebSocketDisconnect):
            raise
        except Exception as exc:
            await self.report_failure(exc)

    def cancel(self, frame, event_id):
        response_id = frame.get("response_id")
        entry = self.responses.get(response_id) if isinstance(response_id, str) else None
        if entry is None:
            raise ApiError("response_not_found", f"no active response {response_id!r} on this connection",
                           param="response_id", event_id=event_id)
        entry[0].cancel()

    async def create(self, frame, event_id):
        self.runtime.check_admission(event_id, self.owner)
        body = {key: value for key, value in frame.items() if key not in ("type", "event_id")}
        parsed = parse_responses_request(body, self.runtime.limits, event_id=event_id, allow_stream=False)
        if parsed.model is not None and parsed.model != self.runtime.settings.served_model_name:
            raise ApiError("model_not_found", f"the model '{parsed.model}' does not exist; this server serves "
                           f"'{self.runtime.settings.served_model_name}'", param="model", event_id=event_id)
        spec = expand_previous_response(self.runtime, parsed, event_id)
        self.runtime.check_admission(event_id, self.owner)
        prepared = await self.runtime.prepare_for(spec, self.owner, event_id)
        generation = self.runtime.open_generation(prepared, spec, "responses.websocket", "resp_", event_id,
                                                  self.owner)
        writer = ResponsesEventWriter(generation, parsed, self.runtime.settings.served_model_name)
        task = asyncio.ensure_future(self.run_response(generation, writer, parsed, spec, event_id))
        self.responses[generation.response_id] = (generation, task)

    async def send_response_event(self, event, response_id):
        if "response" not in event:
            event["response_id"] = response_id
        await self.send(event)

    async def run_response(self, generation, writer, parsed, spec, event_id=None):
        response_id = generation.response_id
        try:
            started = writer.start()
            if event_id is not None:
                started[0]["event_id"] = event_id
            for event in started:
                await self.send(event)
            async for delta in generation.deltas():
                for event in writer.on_delta(delta):
                    await self.send_response_event(event, response_id)
            final_events = writer.finish()
            remember_response(self.runtime, parsed, spec, writer)
            for event in final_events:
                await self.send_response_event(event, response_id)
        except (SendDeadlineExceeded, WebSocketDisconnect):
            generation.abandon()
        except Exception as exc:
            generation.abandon()
            await self.report_failure(exc, response_id)
        finally:
            generation.close()
            self.responses.pop(generation.response_id, None)

    async def report_failure(self, exc, response_id=None):
        if self.closed or self.aborted or isinstance(exc, RuntimeError) and "close message" in str(exc):
            return
        log.error("response %s failed on the WebSocket from %s", response_id, self.websocket.client, exc_info=exc)
        try:
            await self.send_error(server_error("internal_error", "the server failed to produce this response"),
                                  response_id)
        except (SendDeadlineExceeded, WebSocketDisconnect, RuntimeError):
            pass
