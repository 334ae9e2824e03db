"""Maps a CUDA tensor another process shares through CUDA IPC and keeps it until stdin closes:
the "second process that keeps memory after the run's process is gone" of the ghost test.

    python tests/gpu/ipc_holder.py < one line: base64 of pickle(reduce_tensor(t))

Answers ``{"held": pid, "bytes": n, "first": v, "last": v}`` on stdout once mapped (the values
read back prove the mapping is the sender's memory), then waits for EOF or a kill."""

from __future__ import annotations

import base64
import json
import os
import pickle
import sys

import torch


def main() -> None:
    rebuild, args = pickle.loads(base64.b64decode(sys.stdin.readline()))
    tensor = rebuild(*args)
    torch.cuda.synchronize()
    print(
        json.dumps(
            {
                "held": os.getpid(),
                "bytes": tensor.numel() * tensor.element_size(),
                "first": int(tensor[0]),
                "last": int(tensor[-1]),
            }
        ),
        flush=True,
    )
    sys.stdin.read()  # until the test closes stdin (or kills us)
    del tensor


if __name__ == "__main__":
    main()
