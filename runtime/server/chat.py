"""`/v1/chat/completions`: messages → the model's chat template → assistant messages, with
tool calls (`tools.py` before the run, `tool_parsers.py` after), a reasoning model's thinking
split off (`reasoning.py`) and structured outputs; message content is tokenized as text
(`chat_prompt.py`)."""

from __future__ import annotations

import functools
import json
from typing import Any

from pagoda.runtime.engine.info import EngineInfo
from pagoda.runtime.model.tokenizer import TEMPLATE_NAMES
from pagoda.runtime.request import TokenLogprob
from pagoda.runtime.sampling.params import ParamError
from pagoda.runtime.server import chat_images, harmony, reasoning, tools
from pagoda.runtime.server.chat_prompt import encode_chat
from pagoda.runtime.server.endpoint import Endpoint, Job
from pagoda.runtime.server.logprobs import TokenStrings
from pagoda.runtime.server.protocol import APIError, ChatCompletionRequest, shorten
from pagoda.runtime.server.structured_outputs import spec_from_request


def as_system(message: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's `developer` role is the newer name of `system` (instructions to the model): for
    a template that does not know the role, a developer message is a system message (rendered
    as is, it would be a turn the model never saw, after the template's default system prompt)."""
    return {**message, "role": "system"} if message.get("role") == "developer" else message


class ChatEndpoint(Endpoint):
    request_model = ChatCompletionRequest
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"
    id_prefix = "chatcmpl"
    renames = {"prompt": "messages", "logprobs": "top_logprobs"}

    def __init__(self, served_model_names: tuple[str, ...], tool_parser: str = "auto",
                 allow_special_tokens: bool = False,
                 reasoning_parser: str | None = None) -> None:  # fmt: skip
        super().__init__(served_model_names)
        self.tool_parser = tool_parser  # --tool-call-parser: auto (from the template) or a name
        self.reasoning_parser = reasoning_parser  # --reasoning-parser: None or a name
        self._end_id: tuple[Any, int | None] | None = None  # (tokenizer, `</think>`'s one id)
        # --allow-chat-special-tokens: content's special-token text as control tokens
        self.content_as_text = not allow_special_tokens

    def prepare(self, req: ChatCompletionRequest, info: EngineInfo, strings: TokenStrings) -> Job:
        model = self.resolve_model(req.model)
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs requires logprobs=true", param="top_logprobs",
                           code="invalid_value")  # fmt: skip
        vision = chat_images.request_vision(info.vision, req.mm_processor_kwargs)
        max_tokens, renames = req.max_tokens, self.renames
        if req.max_completion_tokens is not None:  # OpenAI's newer name; errors must use it
            max_tokens = req.max_completion_tokens
            renames = {**renames, "max_tokens": "max_completion_tokens"}
        template = info.tokenizer.template_for(bool(req.tools))  # Command R's tool_use one
        setup = tools.prepare(req, template, self.tool_parser, info.tokenizer)
        spec = tools.output_constraint(setup, req.tools, spec_from_request(req))
        # tool_choice required / named: on harmony, the grammar holds the whole reply (its
        # analysis too: `tool_markers`)
        whole = setup is not None and spec is setup.grammar and setup.choice != "auto"
        raw, text, ids, tail, images = self._prompt(req, info, setup,
                                                    self.reasoning_parser is not None)  # fmt: skip
        mm = None
        if images:  # fetched, decoded and preprocessed here; placeholders expanded
            ids, mm = chat_images.prompt_images(ids, images, vision, info.video_io)
        thinking = reasoning.thinks(self.reasoning_parser, tail, req.chat_template_kwargs)
        harmony = self.reasoning_parser == reasoning.HARMONY
        if harmony and spec is not None and not whole:  # its answer follows channels
            raise APIError(400, f"{spec.field} is not applied with --reasoning-parser "
                           f"{reasoning.HARMONY} (gpt-oss's channels)", param=spec.field,
                           code="invalid_value")  # fmt: skip
        if thinking and spec is not None and not harmony:  # the answer, not the thinking
            try:
                spec = reasoning.after_reasoning(spec)
            except ParamError as e:
                raise APIError(400, e.message, param=e.field, code="invalid_value") from e
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        extra = {}
        if (
            setup is not None
            and setup.parser is not None
            and setup.parser.name in ("mistral", "deepseek_v3", "deepseek_v31")
        ):  # [TOOL_CALLS] is a special token, and so may DeepSeek's call markers be
            extra["skip_special_tokens"] = False
        if harmony:
            extra["skip_special_tokens"] = False  # the channels' markers are special tokens
        params = self.sampling_params(
            req, renames, info.sampling_defaults, max_tokens=max_tokens, logprobs=logprobs,
            prompt_logprobs=req.prompt_logprobs, structured_outputs=spec, **extra,
        )  # fmt: skip
        params.multi_modal = mm
        job = self.job(req, model, [ids], [text], params, strings, renames)
        job.tools = setup if setup is not None and setup.parser is not None else None
        job.role = req.reply_role
        if self.reasoning_parser is not None:
            job.reasoning = thinking
            job.reasoning_end_id = self._reasoning_end_id(info.tokenizer)
        if req.echo:  # vLLM's: the last message's content, when the reply continues its role
            if job.tools is not None:
                raise APIError(400, "echo cannot be combined with tools", param="echo",
                               code="invalid_value")  # fmt: skip
            last = raw[-1]
            job.echo_text = _text_of(last.get("content")) if last["role"] == job.role else ""
        return job

    def _reasoning_end_id(self, tokenizer: Any) -> int | None:
        """`</think>`'s token id where it is one token (encoded once per tokenizer)."""
        if self._end_id is None or self._end_id[0] is not tokenizer:
            end = tokenizer.encode(reasoning.END, add_special_tokens=False)
            self._end_id = (tokenizer, end[0] if len(end) == 1 else None)
        return self._end_id[1]

    def prompt(self, req: ChatCompletionRequest, info: EngineInfo,
               setup: tools.ToolSetup | None) -> tuple[list[dict[str, Any]], str, list[int]]:  # fmt: skip
        """(the messages as the template gets them, the rendered text, its token ids): what the
        engine is fed (`/tokenize` with `messages` answers this too: images' placeholders
        expanded, as its `mm_processor_kwargs` over the server's set them; the images read only
        where their runs depend on them: `chat_images.placeholders`)."""
        vision = chat_images.request_vision(info.vision, req.mm_processor_kwargs)
        raw, text, ids, _, images = self._prompt(req, info, setup, tail=False)
        if images:
            ids = chat_images.placeholders(ids, images, vision)
        return raw, text, ids

    def _prompt(self, req: ChatCompletionRequest, info: EngineInfo, setup: tools.ToolSetup | None,
                tail: bool) -> tuple[list[dict[str, Any]], str, list[int], str, list]:  # fmt: skip
        """`prompt`'s (its ids with one token per image), with `tail` the text the template
        adds for the reply (`_reply_tail`, one more rendering; "" without), and the image
        parts ((param, url) each; a 400 for a model that reads text only)."""
        images = _image_parts(req, info)
        template = info.tokenizer.template_for(bool(req.tools))
        # a vision model's templates read content parts, images among them (as transformers'
        # processors render them); others a string
        raw = [m.as_template_dict(parts=info.vision is not None) for m in req.messages]
        if template is not None and "developer" not in template:
            raw = [as_system(m) for m in raw]
        if self.reasoning_parser == reasoning.HARMONY:
            raw = [harmony.template_message(m) for m in raw]
        self.check_length("".join(str(m.get("content", "")) for m in raw), info)
        variables = _template_kwargs(req.chat_template_kwargs, info.tokenizer,
                                     self.content_as_text, bool(req.tools))  # fmt: skip
        variables = _with_effort(variables, req.reasoning_effort, info.tokenizer,
                                 bool(req.tools))  # fmt: skip
        render = functools.partial(
            _render, info.tokenizer.apply_chat_template,
            add_generation_prompt=req.generation_prompt,
            continue_final_message=req.continue_final_message, variables=variables,
        )  # fmt: skip

        def prompt_of(client_messages: list[dict[str, Any]]) -> tuple[Any, Any, str]:
            messages, listed = _render(tools.template_messages, client_messages, setup, template)
            return messages, listed, render(messages, tools=listed)

        messages, listed, text = prompt_of(raw)
        _check_names_rendered(raw, text, lambda ms: prompt_of(ms)[2])
        self.check_length(text, info)
        # `render` runs again there when the client's text holds special-token text
        ids = encode_chat(info.tokenizer, messages, listed, text, self.content_as_text, render)
        added = _reply_tail(req, messages, listed, text, render) if tail else ""
        return raw, text, ids, added, images

    def opening(self, job: Job) -> list[dict[str, Any]]:
        """The role, with `content: ""`, before any token (OpenAI's and vLLM's first chunk).
        With tools the role waits for the first delta (`_with_role`): OpenAI's first chunk of a
        reply that is a call says `content: null`, which is known only once the call begins."""
        if job.tools is not None:
            return []
        out = []
        for i in range(job.num_choices):
            out.append({"index": i, "delta": {"role": job.role, "content": ""}, "logprobs": None})
            if job.echo_text:
                out.append({"index": i, "delta": {"content": job.echo_text}, "logprobs": None})
        return out

    def response_fields(self, job: Job) -> dict[str, Any]:
        """vLLM's `prompt_logprobs` of a chat response (one prompt: the rendered messages)."""
        if job.prompt_logprobs_k is None:
            return {}
        entries = job.prompt_logprobs.get(0)
        return {"prompt_logprobs": job.strings.prompt(job.prompts[0], entries,
                                                      job.prompt_logprobs_k)}  # fmt: skip

    def usage_details(self, job: Job, ids: list[list[int]]) -> dict[str, Any]:
        """With a reasoning parser, OpenAI's `completion_tokens_details.reasoning_tokens` (as
        vLLM's): the thinking's tokens of every choice (`ids`: each choice's output tokens)."""
        if job.reasoning is None:
            return {}
        n = sum(reasoning.reasoning_tokens(ids[i], job.reasoning_streams.get(i),
                                           job.reasoning_end_id, job.strings.text)
                for i in range(len(ids)))  # fmt: skip
        return {"completion_tokens_details": {"reasoning_tokens": n}}

    def _logprobs(self, job: Job, lps: list[TokenLogprob]) -> dict[str, Any] | None:
        return {"content": job.strings.chat(lps)} if job.params.logprobs is not None else None

    def choice(self, job: Job, i: int, text: str, lps: list[TokenLogprob]) -> dict[str, Any]:
        thought, answer = None, text
        if job.reasoning is not None:
            split = job.reasoning_streams[i] = reasoning.new_stream(
                self.reasoning_parser, job.reasoning, _calls(job))  # fmt: skip
            thought, answer = reasoning.split(text, split)
        calls = []
        if job.tools is not None and answer is not None:  # calls are read from the answer only
            # no calls: the parser's content all the same (gpt-oss's: without the normalized
            # text of a call it dropped, as the stream sends none)
            parsed, calls = job.tools.parser.parse(answer, job.tools.parallel)
            answer = parsed if answer else answer  # (an empty reply's content stays "")
        # the echo comes first in content even when the reply is all thinking (as streamed)
        content = job.echo_text + (answer or "") if job.echo_text else answer
        message: dict[str, Any] = {"role": job.role, "content": content}
        if calls:
            job.called.add(i)
            message = {"role": "assistant", "content": answer,
                       "tool_calls": [c.openai() for c in calls]}  # fmt: skip
        if job.reasoning is not None:  # both names: vLLM's `reasoning`, and the older one
            message.update(reasoning=thought, reasoning_content=thought)
        return {"index": i, "message": message, "logprobs": self._logprobs(job, lps)}

    def delta(self, job: Job, i: int, text: str, lps: list[TokenLogprob], offset: int,
              first: bool, final: bool) -> dict[str, Any] | None:  # fmt: skip
        logprobs = self._logprobs(job, lps)
        thought = ""
        if job.reasoning is not None:
            split = job.reasoning_streams.get(i)
            if split is None:
                split = job.reasoning_streams[i] = reasoning.new_stream(
                    self.reasoning_parser, job.reasoning, _calls(job))  # fmt: skip
            thought, text = split.feed(text, final)
        if job.tools is None:
            delta = {"content": text} if text else {}
        else:
            stream = job.tool_streams.get(i)
            if stream is None:
                stream = job.tool_streams[i] = job.tools.parser.stream(job.tools.parallel)
            delta = stream.feed(text, final) if text or final else {}
            if stream.called:
                job.called.add(i)
        if thought:  # both names, as in a full response
            delta = {"reasoning": thought, "reasoning_content": thought, **delta}
        if (
            not delta
            and not final
            and not lps
            and (job.tools is not None or job.reasoning is not None)
        ):
            return None  # held back (a marker or a call may be beginning)
        if job.tools is not None and i not in job.opened:
            delta = _with_role(job, i, delta, final)
        return {"index": i, "delta": delta, "logprobs": logprobs}


def _text_of(content: Any) -> str:
    """A template message's content as text: a vision model's parts' texts, one per line."""
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if p.get("type") == "text")
    return str(content or "")


def _image_parts(req: ChatCompletionRequest, info: EngineInfo) -> list[tuple[str, str, str]]:
    """(param, url, "image" or "video") of the messages' image and video parts, in order; a
    400 where the model reads text only (or no videos), or for more images (videos) than
    --limit-mm-per-prompt allows."""
    found = [(f"messages[{i}].content[{j}]", p.image_url.url, "image")
             for i, m in enumerate(req.messages) for j, p in m.images]  # fmt: skip
    videos = [(f"messages[{i}].content[{j}]", p.video_url.url, "video")
              for i, m in enumerate(req.messages) for j, p in m.videos]  # fmt: skip
    if (found or videos) and info.vision is None:
        param, _, kind = (found or videos)[0]
        raise APIError(400, f"{param}: content parts of type '{kind}_url' are not "
                       "supported; this model reads text only (parts of type 'text')",
                       param=f"{param}.type", code="unsupported_content")  # fmt: skip
    if videos and not chat_images.reads_videos(info.vision):
        raise APIError(400, f"{videos[0][0]}: content parts of type 'video_url' are not "
                       f"supported; this model ({info.vision.kind}) reads images, not videos",
                       param=f"{videos[0][0]}.type", code="unsupported_content")  # fmt: skip
    for kind, parts, limit in (("image", found, info.image_limit),
                               ("video", videos, info.video_limit)):  # fmt: skip
        if len(parts) > limit:
            raise APIError(400, f"at most {limit} {kind}(s) per request "
                           f"(--limit-mm-per-prompt), got {len(parts)}", param="messages",
                           code=f"too_many_{kind}s")  # fmt: skip
    return found + videos


def _calls(job: Job) -> bool:
    """Whether harmony messages to functions are tool calls (`--tool-call-parser openai`)."""
    return job.tools is not None and job.tools.parser.name == "openai"


def _with_role(job: Job, i: int, delta: dict[str, Any], final: bool) -> dict[str, Any]:
    """Choice `i`'s first delta with tools, carrying the role: `content` null unless text comes
    first (a call, or thinking, may follow), so the SDK's accumulated message is the whole
    response's: content null beside calls, or where the only text was a call dropped (to a
    function the request's tools lack: `tool_call.py`), "" for an empty reply without any."""
    job.opened.add(i)
    content = delta.get("content")
    stream = job.tool_streams.get(i)
    if content is None and final and not (stream is not None and stream.read):
        content = ""
    return {"role": job.role, "content": content,
            **{k: v for k, v in delta.items() if k != "content"}}  # fmt: skip


def _template_kwargs(kwargs: dict[str, Any] | None, tokenizer: Any, as_text: bool,
                     tools: bool = False) -> dict[str, Any] | None:  # fmt: skip
    """`chat_template_kwargs`, each a variable this model's chat template reads; one it does not
    read (it would change nothing) or one the server sets itself is a 400 naming it, and so is
    special-token text in a value while the client's text is read as text (`as_text`): the
    template would write it where its own control tokens go."""
    specials = tokenizer.special_text if as_text and kwargs else None
    if specials is not None and specials.search(json.dumps(kwargs, ensure_ascii=False)):
        raise APIError(400, "chat_template_kwargs holds special-token text, which a template "
                       "would write as control tokens; remove it", param="chat_template_kwargs",
                       code="special_tokens_in_content")  # fmt: skip
    for key in kwargs or {}:
        param = f"chat_template_kwargs.{shorten(key, 60)}"
        if key in TEMPLATE_NAMES:
            raise APIError(400, f"{param}: the server sets '{shorten(key, 60)}' itself (use the "
                           "request's fields: messages, tools, add_generation_prompt)",
                           param=param, code="invalid_value")  # fmt: skip
        if key not in tokenizer.variables_for(tools):
            raise APIError(400, f"{param}: this model's chat template does not read "
                           f"'{shorten(key, 60)}', so it would change nothing", param=param,
                           code="unsupported_parameter")  # fmt: skip
    return kwargs


def _with_effort(variables: dict[str, Any] | None, effort: str | None, tokenizer: Any,
                 tools: bool = False) -> dict[str, Any] | None:  # fmt: skip
    """The request's `reasoning_effort` as the chat template's variable of that name (what vLLM
    does; gpt-oss's template writes `Reasoning: <effort>` into its system message). A template
    that does not read it would change nothing: a 400, as for `chat_template_kwargs`."""
    if effort is None:
        return variables
    if "reasoning_effort" not in tokenizer.variables_for(tools):
        raise APIError(400, "reasoning_effort is not supported: this model's chat template does "
                       "not read 'reasoning_effort', so it would change nothing",
                       param="reasoning_effort", code="unsupported_parameter")  # fmt: skip
    given = (variables or {}).get("reasoning_effort", effort)
    if given != effort:
        raise APIError(400, "reasoning_effort and chat_template_kwargs.reasoning_effort "
                       "disagree; give one", param="reasoning_effort",
                       code="invalid_value")  # fmt: skip
    return {**(variables or {}), "reasoning_effort": effort}


def _reply_tail(req: ChatCompletionRequest, messages: list[dict[str, Any]], listed: Any,
                text: str, render: Any) -> str:  # fmt: skip
    """What the chat template adds for the reply: `text` past where it parts from the messages
    rendered without it (the messages before the one continued, with continue_final_message).
    Whether it closes a thinking block decides whether the reply thinks (`reasoning.thinks`)."""
    before = messages[:-1] if req.continue_final_message else messages
    try:
        base = render(before, tools=listed, add_generation_prompt=False,
                      continue_final_message=False)  # fmt: skip
    except APIError:  # a template may refuse the shorter list: look at all of it
        return text
    n = min(len(base), len(text))
    at = next((j for j in range(n) if base[j] != text[j]), n)
    return text[at:]


def _check_names_rendered(raw: list[dict[str, Any]], text: str, render: Any) -> None:
    """A message's `name` is a 400 where the chat template writes no name for messages of its
    role: the prompt is the same with that role's names dropped, so they would be dropped
    silently (SmolLM2's and Llama 3's templates write none; some write the user's only). One
    more rendering (`render`: client messages → prompt) per role that carries names."""
    for role in dict.fromkeys(m["role"] for m in raw if m.get("name") is not None):
        named = next(
            i for i, m in enumerate(raw) if m["role"] == role and m.get("name") is not None
        )
        nameless = [{k: v for k, v in m.items() if k != "name" or m["role"] != role} for m in raw]
        if render(nameless) == text:
            raise APIError(400, f"messages[{named}].name is not supported: this model's chat "
                           f"template does not write the names of {role} messages, so it would "
                           "change nothing (put the name in the content instead)",
                           param=f"messages[{named}].name",
                           code="unsupported_parameter")  # fmt: skip


def _render(apply: Any, *args: Any, **kw: Any) -> Any:
    """`apply(*args, **kw)` (preparing or rendering the chat template), whatever it raises a
    400: a template may raise anything on odd input."""
    try:
        return apply(*args, **kw)
    except RecursionError as e:
        raise APIError(400, "messages are nested too deeply to render", param="messages",
                       code="invalid_messages") from e  # fmt: skip
    except ValueError as e:
        raise APIError(400, str(e), param="messages", code="invalid_messages") from e
    except Exception as e:
        raise APIError(400, f"chat template failed: {e}", param="messages",
                       code="invalid_messages") from e  # fmt: skip
