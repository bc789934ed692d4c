"""The stored-response routes of the Responses API (`POST /v1/responses` is an OpenAI route
of `api.py`'s): `GET /v1/responses/{id}` (a background response's stream with `stream=true`,
from `starting_after`), `DELETE` it, `POST /v1/responses/{id}/cancel`, and
`GET /v1/responses/{id}/input_items`. A query parameter not served, or a value these routes
cannot honour, is a 400 naming it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from pagoda.runtime.server.protocol import APIError
from pagoda.runtime.server.responses import ResponsesEndpoint
from pagoda.runtime.server.responses_background import BackgroundRun
from pagoda.runtime.server.responses_items import (
    bad,
    boolean,
    check_names,
    integer,
    page,
    query_lists,
    refuse_include,
)
from pagoda.runtime.server.responses_store import StoredResponse
from pagoda.runtime.server.serving import to_json

RETRIEVE_QUERY = ("stream", "starting_after", "include", "include_obfuscation")


def add_response_routes(app: FastAPI, endpoint: ResponsesEndpoint,
                        authorize: Callable[[Request], None]) -> None:  # fmt: skip
    store = endpoint.store

    def query(raw: Request, served: tuple[str, ...] = ()) -> dict[str, list[str]]:
        found = query_lists(raw.query_params.multi_items())
        check_names(found, served)
        return found

    @app.get("/v1/responses/{response_id}", include_in_schema=False)
    async def get(raw: Request, response_id: str) -> Response:
        authorize(raw)
        q = query(raw, RETRIEVE_QUERY)
        refuse_include(q)
        if boolean(q, "include_obfuscation"):
            raise bad("include_obfuscation", "include_obfuscation=true is not supported: stream "
                      "events are sent without obfuscation", code="unsupported_value")  # fmt: skip
        stream = bool(boolean(q, "stream"))
        after = integer(q, "starting_after", -1, 0)
        if after >= 0 and not stream:
            raise bad("starting_after", "starting_after is only read with stream=true")
        entry = store.get(response_id)
        if not stream:
            return Response(entry.body, media_type="application/json")
        return StreamingResponse(_events(entry).follow(after), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # fmt: skip

    @app.delete("/v1/responses/{response_id}", include_in_schema=False)
    async def delete(raw: Request, response_id: str) -> dict[str, Any]:
        authorize(raw)
        query(raw)
        entry = store.delete(response_id)
        if entry.run is not None:  # a run still going has nowhere to go now
            await entry.run.cancel()
        return {"id": response_id, "object": "response", "deleted": True}

    @app.post("/v1/responses/{response_id}/cancel", include_in_schema=False)
    async def cancel(raw: Request, response_id: str) -> Response:
        """OpenAI's: a background response is cancelled (one that has ended is answered as it
        is); any other is a 400."""
        authorize(raw)
        query(raw)
        run = store.get(response_id).run
        if run is None:
            raise APIError(400, "Cannot cancel a synchronous response.", param="response_id",
                           code="invalid_request")  # fmt: skip
        await run.cancel()
        return Response(run.body, media_type="application/json")

    @app.get("/v1/responses/{response_id}/input_items", include_in_schema=False)
    async def input_items(raw: Request, response_id: str) -> Response:
        authorize(raw)
        q = query(raw, ("limit", "order", "after", "include"))
        items = store.get(response_id).items
        return Response(to_json(page(items, q)), media_type="application/json")


def _events(entry: StoredResponse) -> BackgroundRun:
    """The run whose events a stream replays; a 400 for a response that has none."""
    if entry.run is None:
        raise bad("stream", "stream=true is only for background responses (this one was "
                            "answered when it was created)")  # fmt: skip
    if not entry.run.keep_events:
        raise bad("stream", "this background response was created without stream: it has no "
                            "events to stream (poll it without stream)")  # fmt: skip
    return entry.run
