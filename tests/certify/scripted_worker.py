"""A stand-in for fa4_aot.certify.checker that needs no GPU, for tests/certify/test_pool.py: it speaks the worker's
protocol and does what each check's label tells it (pass, wrong, crash: say so and exit, die: exit without a word,
hang: sleep, bwd-hang: announce the backward part, then sleep, oom: out of GPU memory with the context lost: an error
marked restart, then exit, jobs: pass, saying the worker count per GPU it was told, memory: pass, saying the GPU
memory it was granted, threads: pass, saying its OMP_NUM_THREADS, variants: pass, saying the SKU table it was told,
ours and fa4: wrong, and under the JIT oracle wrong again only for fa4), so that the pool's real process handling is
exercised."""

import json
import os
import sys
import time

for line in sys.stdin:
    request = json.loads(line)
    ident, how = request["id"], request["check"]["label"]
    say = lambda doc: (sys.stdout.write(json.dumps(doc) + "\n"), sys.stdout.flush())  # noqa: E731
    say({"id": ident, "part": "fwd"})
    if how == "pass":
        say({"id": ident, "status": "pass", "failures": []})
    elif how == "wrong":
        say({"id": ident, "part": "bwd"})
        say({"id": ident, "status": "wrong", "failures": [{"tensor": "dq", "error": 1.3, "bound": 0.01}]})
    elif how == "crash":
        say({"id": ident, "status": "crash", "detail": "CUDA error: an illegal memory access was encountered"})
        os._exit(3)
    elif how == "oom":
        say({"id": ident, "status": "error", "restart": True,
             "detail": "out of GPU memory, not a kernel fault: AcceleratorError: CUDA error: out of memory"})
        os._exit(3)
    elif how == "variants":  # pass, saying the SKU table it reads
        say({"id": ident, "status": "pass", "failures": [], "detail": os.environ.get("FA4_AOT_VARIANTS", "")})
    elif how in ("ours", "fa4"):  # wrong through the store; under the JIT oracle, wrong only for "fa4"
        jit = os.environ.get("FA4_AOT_CERTIFY_ORACLE") == "jit"
        wrong = how == "fa4" or not jit
        say({"id": ident, "status": "wrong" if wrong else "pass",
             "failures": [{"tensor": "dk", "error": 4.12, "bound": 0.00156}] if wrong else []})
    elif how == "threads":
        say({"id": ident, "status": "pass", "failures": [], "detail": os.environ.get("OMP_NUM_THREADS", "")})
    elif how == "memory":
        say({"id": ident, "status": "pass", "failures": [], "detail": str(request.get("memory"))})
    elif how == "jobs":
        say({"id": ident, "status": "pass", "failures": [], "detail": os.environ.get("FA4_AOT_CERTIFY_JOBS", "")})
    elif how == "die":
        os._exit(9)
    elif how in ("hang", "bwd-hang"):
        if how == "bwd-hang":
            say({"id": ident, "part": "bwd"})
        time.sleep(3600)
