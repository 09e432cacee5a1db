"""The DE read path's decode side (paper §4.1, Figure 4b): read a hit from storage through this node's SNIC
into DRAM, then write it, Layer Block by Layer Block, into the prefill instance's buffer.

    prefill connector ──notice {op: read, job, blocks, ...}──► DeReadService (decode side)
    DeReadService: for layer l: read Layer Block l of each block (SNIC rx, one pread each) into DRAM
                   ──write into the prefill's "kv_in" buffer + notice {job, layer, block}──► prefill connector

A block that is missing or fails its checksum is answered with a notice carrying `error` (no bytes): the
prefill side reports its vLLM blocks as load errors, so they are recomputed, never served.
The transfer backend is shared memory on one host or TCP across hosts (endpoints.py); a read request carries
the address to answer at.
"""

from __future__ import annotations

import argparse
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dualpath.integrations.vllm.endpoints import TRANSPORTS, Peers, make_backend
from dualpath.kvcache import FileStore, KVStore, key_from_hex
from dualpath.transfer import BlockRead, ReadJob, Snic
from dualpath.transfer.storage_io import StorageReader

RECEIVE_BUFFER = "kv_in"  # the prefill instance's registered buffer that DE reads land in
UNLIMITED_BYTES_PER_S = 1e15  # an SNIC with no emulated limit


def make_snic(name: str, rate_bytes_per_s: float) -> Snic:
    return Snic(name, rate_bytes_per_s or UNLIMITED_BYTES_PER_S)


class DeReadService:
    def __init__(
        self,
        *,
        endpoint: str,
        namespace: str,
        store: KVStore,
        snic: Snic,
        transport: str = "shm",
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.endpoint = endpoint
        self.namespace = namespace
        self.snic = snic
        self.backend = make_backend(endpoint, transport=transport, namespace=namespace, host=host, port=port)
        self._peers = Peers(self.backend, namespace)
        self._reader = StorageReader(store, snic)
        self._jobs = ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"{endpoint}-de")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"{endpoint}-notices", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            notice = self.backend.recv_notice(0.05)
            if notice is not None and notice.payload.get("op") == "read":
                self._jobs.submit(self._read_job, notice.payload)

    def _read_job(self, req: dict[str, Any]) -> None:
        peer = self._peers(req["reply_to"], req.get("reply_address"))
        keys = [key_from_hex(k) for k in req["keys"]]
        layer_bytes = int(req["layer_block_bytes"])
        base = int(req["offset_bytes"])
        for layer in range(int(req["num_layers"])):
            dram = bytearray(layer_bytes * len(keys))  # this node's DRAM buffer for the layer's reads
            view = memoryview(dram)
            blocks = tuple(
                BlockRead(key=k, out=view[i * layer_bytes : (i + 1) * layer_bytes], layer=layer)
                for i, k in enumerate(keys)
            )
            job_id = f"{req['job']}:{layer}"
            result = self._reader.submit(ReadJob(job_id=job_id, blocks=blocks, tokens=0)).result()
            ok = set(result.ok_keys)
            for i, key in enumerate(keys):
                tag = {"job": req["job"], "layer": layer, "block": i}
                if key in ok:
                    offset = base + (layer * len(keys) + i) * layer_bytes
                    chunk = view[i * layer_bytes : (i + 1) * layer_bytes]
                    self.backend.write(peer, RECEIVE_BUFFER, offset, chunk, notice=tag)
                else:
                    self.backend.notify(peer, tag | {"error": "missing or corrupt"})

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._jobs.shutdown(wait=True)
        self._reader.close()
        self.backend.close()


def main(argv: list[str] | None = None) -> None:
    """Run a DE read service on its own (a decode node without a vLLM instance, or for tests)."""
    parser = argparse.ArgumentParser(prog="python -m dualpath.integrations.vllm.de_service")
    parser.add_argument("--store-dir", required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--namespace", default="dualpath")
    parser.add_argument("--snic-bytes-per-s", type=float, default=0.0)
    parser.add_argument("--capacity-bytes", type=int, default=64 * 2**30)
    parser.add_argument("--transport", choices=TRANSPORTS, default="shm")
    parser.add_argument("--host", default="127.0.0.1", help="tcp: the address to listen on")
    parser.add_argument("--port", type=int, default=0, help="tcp: the port to listen on (0: any)")
    args = parser.parse_args(argv)
    store = FileStore(args.store_dir, args.capacity_bytes)
    service = DeReadService(
        endpoint=args.endpoint,
        namespace=args.namespace,
        store=store,
        snic=make_snic(args.endpoint + ".snic", args.snic_bytes_per_s),
        transport=args.transport,
        host=args.host,
        port=args.port,
    )
    print(f"DE read service {args.endpoint} on {service.backend.address}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        service.close()


if __name__ == "__main__":
    main()
