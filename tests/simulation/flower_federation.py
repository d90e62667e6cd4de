"""Run with Flower's venv's python (tests/simulation/test_flower_strategy.py): a federation in Flower's simulation,
the server's strategy from hasfl_ray.flower.Strategy, its clients hasfl_ray.flower's; prints one JSON line after
MARK with the final global parameters' params_sha256, the strategy's per-round history and whether the fused
kernel (hasfl_ray._C) aggregated them.

    python flower_federation.py CONFIG_JSON
"""

import json
import sys

MARK = "FLOWER_FEDERATION "


def main() -> None:
    config = json.loads(sys.argv[1])
    from flwr.client import ClientApp
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.simulation import run_simulation

    from hasfl_ray.flower import Strategy, client_fn

    strategy = Strategy(config["algorithm"], config)

    def server_fn(context):
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=config["rounds"]))

    run_simulation(server_app=ServerApp(server_fn=server_fn), client_app=ClientApp(client_fn=client_fn(config)),
                   num_supernodes=config["clients"],
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": 2, "include_dashboard": False,
                                                 "object_store_memory": 200 * 1024 ** 2}})
    from hasfl_ray.ops import available

    print(MARK + json.dumps({"params_sha256": strategy.params_sha256(), "history": strategy.history,
                             "fused": available()}), flush=True)


if __name__ == "__main__":
    main()
