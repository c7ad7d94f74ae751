"""schemathesis against `rlx serve`, driven by the server's /openapi.json.

Starts `$RLX_BIN serve --embed-model minilm --llm smollm2 --port 0 --ctx 128
--timeout 20` and runs schemathesis over every documented operation with
generated valid and invalid requests (`--mode all`, a fixed seed and a
bounded number of examples), checking that no response is a 5xx, that every
status code, content type and JSON body is the one the document gives, and
that responses are fast enough (`--max-response-time`). Then /health must
still be 200: no input crashed or wedged the server. Exits non-zero on any
failure.
"""

import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

RLX = os.environ.get("RLX_BIN", "target/debug/rlx")
ST = os.path.join(os.path.dirname(sys.executable), "schemathesis")


def start():
    p = subprocess.Popen(
        [RLX, "serve", "--embed-model", "minilm", "--llm", "smollm2", "--port", "0",
         "--ctx", "128", "--timeout", "20"],
        stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    m = re.search(r"listening on (http://\S+)", line)
    if not m:
        p.kill()
        sys.exit(f"rlx serve did not start: {line!r}")
    base = m.group(1)
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    for _ in range(600):
        if healthy(base):
            return p, base
        time.sleep(0.2)
    p.kill()
    sys.exit("rlx serve was not healthy after 120 s")


def healthy(base):
    try:
        with urllib.request.urlopen(base + "/health", timeout=10) as r:
            return r.status == 200
    except Exception:
        return False


def main():
    p, base = start()
    try:
        cmd = [ST, "run", base + "/openapi.json",
               "--checks", "not_a_server_error,status_code_conformance,"
               "content_type_conformance,response_schema_conformance",
               "--mode", "all", "--max-examples", os.environ.get("RLX_ST_EXAMPLES", "20"),
               "--seed", "1", "--workers", "1", "--request-timeout", "60",
               "--max-response-time", "30", "--phases", "coverage,fuzzing",
               "--warnings", "off"]
        print(" ".join(cmd), flush=True)
        code = subprocess.run(cmd).returncode
        alive = p.poll() is None and healthy(base)
        print(f"schemathesis exit {code}; server {'healthy' if alive else 'NOT healthy'} after the run")
    finally:
        if p.poll() is None:
            p.kill()
    sys.exit(0 if code == 0 and alive else 1)


if __name__ == "__main__":
    main()
