"""OutputProcessor: sampled tokens → text deltas and `StepOutput`s, one per live sample.

It owns what the engine keeps per request for its outputs (incremental detokenizer, parent
request and sample index) in one record per sample, so a step costs one dictionary lookup per
request. At 256 running requests this is a few microseconds each, the largest per-request host
cost of a decode step after scheduling; the loops below therefore touch each request once and
call the tokenizer's streaming decoder directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat

from pagoda.runtime.engine.detokenizer import IncrementalDetokenizer
from pagoda.runtime.engine.outputs import StepOutput
from pagoda.runtime.engine.pooling import vector_bytes
from pagoda.runtime.model.tokenizer import Tokenizer
from pagoda.runtime.request import FINISH_REASONS, FIRST_FINISHED, Request, RequestStatus
from pagoda.runtime.worker.outputs import ModelRunnerOutput
from pagoda.runtime.worker.step_clock import StepClock

_STOPPED = RequestStatus.FINISHED_STOPPED


@dataclass(slots=True)
class _Sample:
    """Output-side state of one sample (a child request when n > 1)."""

    detok: IncrementalDetokenizer
    parent: str  # the request id the client knows
    index: int  # the sample's choice index


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        tokenizer.stream_decoder(())  # builds its per-token tables now, not on a first request
        self.samples: dict[str, _Sample] = {}  # child id → its state
        self.children: dict[str, list[str]] = {}  # request id → live child ids

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.children

    def add(self, request_id: str, reqs: Sequence[Request]) -> None:
        """Track the samples of a new request (one child per sample)."""
        for index, req in enumerate(reqs):
            p = req.params
            detok = IncrementalDetokenizer(
                self.tokenizer,
                req.prompt_token_ids,
                stop=p.stop,
                include_stop=p.include_stop_str_in_output,
                skip_special_tokens=p.skip_special_tokens,
            )
            self.samples[req.request_id] = _Sample(detok, request_id, index)
        self.children[request_id] = [r.request_id for r in reqs]

    def abort(self, request_id: str) -> list[str]:
        """Forget a request; returns its child ids (for the scheduler to abort)."""
        ids = self.children.pop(request_id, [])
        for cid in ids:
            self.samples.pop(cid, None)
        return ids

    def check_stop_string(self, req: Request, token_id: int) -> None:
        """For requests with stop strings, detokenize now (before the next schedule) and stop
        the request when its text completes one (one that ends after its first `min_tokens`
        tokens' text). A stop or EOS token adds its text only with `include_stop_str_in_output`
        (as vLLM's detokenizer does)."""
        detok = self.samples[req.request_id].detok
        if not detok.stop or (req.status == _STOPPED and not detok.include_stop):
            return
        search = req.num_output_tokens > req.params.min_tokens
        detok.pos = len(req.token_ids)
        if detok.add_tokens([token_id], search) is not None:
            req.status = _STOPPED
            req.stop_reason = detok.stop_string

    def process(self, result: ModelRunnerOutput, clock: StepClock | None) -> list[StepOutput]:
        """Detokenize (requests without stop strings) and build the outputs of one step;
        requests aborted since the step ran are skipped."""
        if result.pooled is not None:
            return self._pooled(*result.pooled)
        samples = self.samples
        live = []
        # with drafts a request has several entries: each's sequence length (`positions`)
        positions = result.positions or repeat(None)
        for req, tok, lp, pos in zip(result.requests, result.token_ids, result.logprobs, positions):
            s = samples.get(req.request_id)
            if s is None:
                continue
            detok = s.detok
            if tok < 0:  # no token (non-finite logits): the request ended with an error
                live.append((s, req, tok, lp, pos))
                continue
            if not detok.stop and (
                req.status != _STOPPED
                or detok.include_stop
                or (pos is not None and pos < len(req.token_ids))  # a token before its stop
            ):
                # a stop/EOS token adds no text unless asked to
                stream = detok.stream  # IncrementalDetokenizer.push, inlined
                if stream is None:
                    detok.push(tok)
                else:
                    try:
                        c = stream(tok)
                    except Exception as e:
                        c = detok.recover(tok, e)
                    if c:
                        detok.text += c
                    else:
                        detok.wait(tok, pos or len(req.token_ids))
            live.append((s, req, tok, lp, pos))
        if clock is not None:
            clock.mark("detokenize")
        outputs = []
        append = outputs.append
        for s, req, tok, lp, pos in live:
            detok = s.detok
            if detok.stop or req.status >= FIRST_FINISHED:
                append(self._output(s, req, tok, lp, pos))
                continue
            # `_output` of a running request without stop strings: all its text goes out
            text, detok.text = detok.text, ""
            num_output = (pos or len(req.token_ids)) - req.num_prompt_tokens
            append(
                StepOutput(
                    s.parent,
                    s.index,
                    [tok],
                    text,
                    [lp] if lp is not None else [],
                    False,
                    None,
                    req.stop_reason,
                    req.num_prompt_tokens,
                    req.num_cached_tokens,
                    num_output,
                    req.arrival_time,
                    req.first_scheduled_time,
                    req.first_token_time,
                    _prompt_logprobs(req) if num_output == 1 else None,
                )
            )
        if clock is not None:
            clock.mark("outputs")
        return outputs

    def _output(self, s: _Sample, req: Request, tok: int, lp, pos: int | None = None) -> StepOutput:
        """A finished (or stop-string-watched) sample's output; `tok` −1: its step gave no
        token (finish reason "error"), so only the text held back so far goes out."""
        status = req.status  # read once: this runs per request per step
        ok = tok >= 0
        finished = status >= FIRST_FINISHED
        if pos is not None and pos < len(req.token_ids):  # not its step's last entry
            finished = False
        detok = s.detok
        if finished and detok.stop_string is None:  # a cut character's bytes are read now
            ids = req.token_ids
            fed = status != _STOPPED or detok.include_stop  # the stop token's text is shown?
            detok.flush(len(ids) - (not fed))
        num_output = (pos or len(req.token_ids)) - req.num_prompt_tokens
        out = StepOutput(
            s.parent,
            s.index,
            [tok] if ok else [],
            detok.pop_delta(finished),
            [lp] if lp is not None and ok else [],
            finished,
            FINISH_REASONS[status] if finished else None,
            req.stop_reason if finished else None,
            req.num_prompt_tokens,
            req.num_cached_tokens,
            num_output,
            req.arrival_time,
            req.first_scheduled_time,
            req.first_token_time,
            _prompt_logprobs(req) if num_output == ok else None,
        )
        if finished:
            self._forget(req.request_id, s.parent)
        return out

    def _pooled(self, reqs: list[Request], vectors) -> list[StepOutput]:
        """The pooling runner's outputs: each finished prompt's vector, no tokens or text."""
        outputs = []
        for req, data in zip(reqs, vector_bytes(vectors)):
            s = self.samples.get(req.request_id)
            if s is None:
                continue
            outputs.append(StepOutput(
                s.parent, s.index, [], "", [], True, FINISH_REASONS[req.status], None,
                req.num_prompt_tokens, req.num_cached_tokens, 0, req.arrival_time,
                req.first_scheduled_time, None, None, data,
            ))  # fmt: skip
            self._forget(req.request_id, s.parent)
        return outputs

    def _forget(self, child_id: str, parent: str) -> None:
        del self.samples[child_id]
        siblings = self.children.get(parent)
        if siblings is not None and child_id in siblings:
            siblings.remove(child_id)
            if not siblings:
                del self.children[parent]


def _prompt_logprobs(req: Request) -> list | None:
    """What a sample's first output carries: its prompt's logprobs, if it asked."""
    return req.prompt_logprobs if req.params.prompt_logprobs is not None else None
