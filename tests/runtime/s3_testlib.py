"""A local S3-compatible server for tests: moto's server mode (`moto[server]`) on 127.0.0.1.

`MotoS3.env` is what a pod would get from its Secret (endpoint, keys, region). With
`require_auth()` moto checks every request against its IAM: only the access key made by
`MotoS3.start` (allowed s3:*) gets in; any other key is answered 403 InvalidAccessKeyId.
"""

from __future__ import annotations

import contextlib
import json
import logging
import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

POLICY = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}  # fmt: skip


class MotoS3:
    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.env: dict[str, str] = {}

    def start(self) -> MotoS3:
        self.server.start()
        host, port = self.server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        base = {"AWS_ENDPOINT_URL": endpoint, "AWS_REGION": "us-east-1"}
        iam = self._client(
            "iam", {**base, "AWS_ACCESS_KEY_ID": "admin", "AWS_SECRET_ACCESS_KEY": "x"}
        )
        # moto keeps its backends per process, not per server: a second server in the same
        # pytest run already sees the first one's users, so each instance names its own.
        user = f"pagoda-{uuid.uuid4().hex[:8]}"
        iam.create_user(UserName=user)
        iam.put_user_policy(UserName=user, PolicyName="s3", PolicyDocument=json.dumps(POLICY))
        key = iam.create_access_key(UserName=user)["AccessKey"]
        self.env = {
            **base,
            "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
        }
        return self

    def stop(self) -> None:
        self.server.stop()

    def _client(self, service: str, env: dict[str, str]) -> Any:
        import boto3

        return boto3.session.Session(
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name=env["AWS_REGION"],
        ).client(service, endpoint_url=env["AWS_ENDPOINT_URL"])

    def client(self) -> Any:
        return self._client("s3", self.env)

    def upload_dir(self, bucket: str, prefix: str, folder: pathlib.Path) -> None:
        s3 = self.client()
        with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
            s3.create_bucket(Bucket=bucket)
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                s3.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder).as_posix()}")

    @contextlib.contextmanager
    def require_auth(self) -> Iterator[None]:
        from moto.core.authorization import enable_iam_authentication

        with enable_iam_authentication():
            yield
