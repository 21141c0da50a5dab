"""`python -m tests.simrig up|down|reboot|images [--name N] [--port P]`: manage a simulated rig by hand.

`up` also builds the vLLM stand-in image and the demo models' stand-in
checkpoints that inventory/rigs/sim.yml serves (the deploy copies them onto volumes).
`images` builds the images the tests' engine processes share (the rig's, the bare rig's, the
stand-in's) where missing, once, before `./run test` starts those processes side by side.
"""

import argparse

from tests.simrig.bare_image import ensure_bare_image
from tests.simrig.image import ensure_image
from tests.simrig.rig import SimRig
from tests.simrig.weights import ensure_checkpoint
from tests.vllm_standin.image import ensure_standin_image

DEMO_MODELS = ("sim-chat", "sim-coder")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.simrig")
    parser.add_argument("action", choices=["up", "down", "reboot", "images"])
    parser.add_argument("--name", default="rigkit-sim")
    parser.add_argument("--port", type=int, default=2222)
    args = parser.parse_args()
    if args.action == "images":
        ensure_image()
        ensure_bare_image()
        ensure_standin_image()
        return
    rig = SimRig(name=args.name, ssh_port=args.port)
    if args.action == "up":
        rig.start()
        ensure_standin_image()
        for model in DEMO_MODELS:
            ensure_checkpoint(model)
        print(f"rig {rig.name} is up: ssh -i {rig.ssh_key} -p {rig.ssh_port} root@127.0.0.1")
    elif args.action == "reboot":
        rig.reboot()
    else:
        rig.remove()


if __name__ == "__main__":
    main()
