"""vLLM's `POST /classify` on a pooling server that runs a sequence classifier
(`*ForSequenceClassification`: `pooler_config.CROSS_ENCODERS`, any number of labels).

`input`: a string, a list of strings, a list of token ids or a list of such lists (as
/v1/embeddings takes it, with vLLM's `truncate_prompt_tokens`); each is one engine request whose
pooled row goes through the classifier's head to its labels' probabilities (softmax; sigmoid for
one label or `problem_type` multi_label_classification: `model/classifier_head.py`). Answers
`{"id", "object": "list", "created", "model", "data": [{"index", "label", "probs",
"num_classes"}], "usage"}`: `label` is config.json's id2label name of the likeliest. An embedding
model answers it with the 400 `unsupported_api`, as a generating server does.
"""

from __future__ import annotations

import time
import uuid

import numpy as np
from pagoda.runtime.engine.info import EngineInfo
from pagoda.runtime.engine.outputs import StepOutput
from pagoda.runtime.engine.pooling import vector
from pagoda.runtime.server.embeddings import EmbeddingsRoute, input_prompts, usage
from pagoda.runtime.server.protocol import APIError, _Strict
from pagoda.runtime.server.request_body import parse_request
from pagoda.runtime.server.serving import to_json
from pydantic import Field, StrictInt, StrictStr


class ClassificationRequest(_Strict):
    model: str | None = None
    input: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    truncate_prompt_tokens: StrictInt | None = Field(default=None, ge=-1)
    user: str | None = None


class ClassifyRoute(EmbeddingsRoute):
    api, input_param, id_prefix = "Classification", "input", "classify"

    def parse(self, body: bytes, info: EngineInfo) -> tuple[ClassificationRequest, list[list[int]]]:
        req = parse_request(body, ClassificationRequest)
        self.resolve_model(req.model)
        if not info.pooler.cross_encoder:
            raise APIError(400, "The model does not support the Classification API: it is an "
                           "embedding model (/v1/embeddings, /v1/score, /v1/rerank)",
                           code="unsupported_api")  # fmt: skip
        return req, input_prompts(req, info)

    def body(self, req: ClassificationRequest, info: EngineInfo, outs: list[StepOutput]) -> bytes:
        labels = info.pooler.labels
        data = []
        for i, out in enumerate(outs):
            probs = vector(out.embedding, None, False)
            data.append({"index": i, "label": labels[int(np.argmax(probs))],
                         "probs": probs.tolist(), "num_classes": len(probs)})  # fmt: skip
        return to_json({"id": f"classify-{uuid.uuid4().hex}", "object": "list",
                        "created": int(time.time()), "model": self.resolve_model(req.model),
                        "data": data, "usage": usage(outs)})  # fmt: skip
