"""TensorBased models of workers that are not bridge workers, from Dynamo's own model cards.

A bridge worker describes its models on the control endpoint (directory.py). Any other Dynamo
worker (one that calls `register_model(ModelInput.Tensor, ModelType.TensorBased, ...)`, as
Dynamo's KServe frontend expects) has only its model deployment card, which Dynamo's discovery
keeps under `v1/mdc/<namespace>/<component>/<endpoint>/<instance id hex>` (ai-dynamo-runtime 1.6.1,
measured): with `--discovery-backend file` one JSON file per card in `$DYN_FILE_KV/v1/mdc/`
(the key URL-encoded as the file name), with `etcd` one key holding the same JSON, bound to the
worker's lease. The Python binding lists no cards of a namespace (it has per-component watchers
only), so the door reads the store the way Dynamo's own frontends watch it; nothing travels
outside Dynamo. Each card gives the model's name, its endpoint, and `tensor_model_config` with
the Triton `ModelConfig` (`triton_model_config`, serialized) when the worker sent one.

Such a model gets one entry with `bridge_form=False`: the door sends it Dynamo's standard
`NvCreateTensorRequest` (typed per-element lists) and turns its answers back into raw outputs
(foreign.py). A name a bridge worker knows is the bridge worker's. A foreign model has no
versions of its own: the door shows it as version 1. With `mem` discovery (one process) and
`kubernetes` (not read here) there are no foreign cards.

The file backend keeps a crashed worker's cards (Dynamo's own clients then still list its
instance, measured); requests to it then fail UNAVAILABLE, as they would through Dynamo's
frontend.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from ...codec import TO_KSERVE

log = logging.getLogger(__name__)

CARDS_PREFIX = "v1/mdc/"
FOREIGN_VERSION = "1"
# One read of the model cards from etcd: the door asks several times a second while in use, and
# an etcd that has not answered in 2 s is away (the discovery probe's bound, roles/discovery.py).
ETCD_TIMEOUT_S = 2.0


def card_config(name: str, tensor_config: Mapping[str, Any]) -> mc.ModelConfig:
    """The Triton config a card carries, or one built from its tensor lists."""
    config = mc.ModelConfig()
    serialized = tensor_config.get("triton_model_config")
    if serialized:
        config.ParseFromString(bytes(serialized))
    else:
        for kind, target in (("inputs", config.input), ("outputs", config.output)):
            for tensor in tensor_config.get(kind) or ():
                datatype = "TYPE_" + TO_KSERVE[tensor["data_type"]].replace("BYTES", "STRING")
                target.add(
                    name=tensor["name"],
                    data_type=mc.DataType.Value(datatype),
                    dims=list(tensor.get("shape") or ()),
                )
    if not config.name:
        config.name = name
    return config


def parse_card(text: str | bytes, namespace: str) -> tuple[str, str, mc.ModelConfig] | None:
    """(model name, endpoint path, config) of a TensorBased card in `namespace`, else None."""
    try:
        card = json.loads(text)
        if card.get("type") != "Model" or card.get("namespace") != namespace:
            return None
        body = card["card_json"]
        if body.get("model_type") != "TensorBased":
            return None
        tensor_config = body.get("tensor_model_config") or {}
        name = str(tensor_config.get("name") or body["display_name"])
        endpoint = f"{card['namespace']}.{card['component']}.{card['endpoint']}"
        return name, endpoint, card_config(name, tensor_config)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        log.info("skipping a model card that does not parse: %s", exc)
        return None


def card_instance(key: str) -> int | None:
    """The instance id a card's key ends with (`v1/mdc/<ns>/<component>/<endpoint>/<id in hex>`;
    a file's name is the same path, escaped), None when it does not parse."""
    last = urllib.parse.unquote(key).rsplit("/", 1)[-1]
    try:
        return int(last, 16)
    except ValueError:
        return None


class ModelCards:
    """Reads the TensorBased cards of one namespace from Dynamo's discovery store."""

    def __init__(self, backend: str, namespace: str, environ: Mapping[str, str] = os.environ):
        self.backend = backend
        self.namespace = namespace
        self._folder = (
            Path(environ.get("DYN_FILE_KV") or Path(tempfile.gettempdir()) / "dynamo_store_kv")
            / CARDS_PREFIX
        )
        endpoints = environ.get("ETCD_ENDPOINTS") or "http://127.0.0.1:2379"
        first = endpoints.split(",")[0].strip()
        self._etcd = first if "://" in first else f"http://{first}"
        self._parsed: dict[str, tuple[str, str, mc.ModelConfig] | None] = {}
        self._etcd_failing = False  # the last read from etcd failed (logged once per streak)

    async def read(
        self, left_out: frozenset[int] = frozenset()
    ) -> list[tuple[str, str, mc.ModelConfig]]:
        """Every TensorBased card of the namespace now: (model name, endpoint, config), less
        those of the instances `left_out` (workers this process cannot reach: a bridge worker
        left out of the index would otherwise come back here as a foreign one)."""
        if self.backend == "file":
            items = await asyncio.to_thread(self._read_folder)
        elif self.backend == "etcd":
            items = await asyncio.to_thread(self._read_etcd)
        else:
            return []
        parsed = {}
        for key, text in items:
            # Cards never change once written (Dynamo refuses a mutation): parse each once.
            known = key in self._parsed
            parsed[key] = self._parsed[key] if known else parse_card(text, self.namespace)
        self._parsed = parsed
        return [
            card
            for key, card in parsed.items()
            if card is not None and card_instance(key) not in left_out
        ]

    def _read_folder(self) -> list[tuple[str, bytes]]:
        # Dynamo escapes every character but letters and digits in the file name (`_` is %5F).
        prefix = f"{self.namespace}/"
        try:
            names = [
                n for n in os.listdir(self._folder) if urllib.parse.unquote(n).startswith(prefix)
            ]
        except FileNotFoundError:
            return []
        items = []
        for name in names:
            if name in self._parsed:
                items.append((name, b""))
                continue
            try:
                items.append((name, (self._folder / name).read_bytes()))
            except FileNotFoundError:
                continue  # withdrawn meanwhile
        return items

    def _read_etcd(self) -> list[tuple[str, bytes]]:
        """A prefix range over etcd's JSON gateway (`/v3/kv/range`, etcd ≥ 3.4)."""
        prefix = f"{CARDS_PREFIX}{self.namespace}/".encode()
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        body = json.dumps(
            {"key": base64.b64encode(prefix).decode(), "range_end": base64.b64encode(end).decode()}
        ).encode()
        request = urllib.request.Request(f"{self._etcd}/v3/kv/range", data=body, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=ETCD_TIMEOUT_S) as response:
                answer = json.load(response)
        except (OSError, ValueError) as exc:
            # Said once per outage (the door asks several times a second while in use); the
            # process's readiness and its ERROR line tell the rest (bridge/roles/discovery.py).
            log.log(logging.DEBUG if self._etcd_failing else logging.INFO,
                    "reading model cards from etcd failed: %s", exc)  # fmt: skip
            self._etcd_failing = True
            return [(key, b"") for key in self._parsed]  # keep what was seen
        self._etcd_failing = False
        return [
            (base64.b64decode(kv["key"]).decode(), base64.b64decode(kv.get("value", "")))
            for kv in answer.get("kvs", ())
        ]
