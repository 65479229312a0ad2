"""Reads back what a kart training run sent to MLflow and wrote for TensorBoard, through each
tool's own reader, and prints it as JSON for tests/tests/tracking.rs.

    read_back.py mlflow TRACKING_URI RUN_ID   {status, params, tags, metrics: {key: [[step, value]]}}
    read_back.py tensorboard DIR              {tag: [[step, value]]} of every scalar event file in DIR
"""

import json
import sys


def mlflow(uri, run_id):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    metrics = {
        key: [[m.step, m.value] for m in client.get_metric_history(run_id, key)] for key in run.data.metrics
    }
    experiment = client.get_experiment(run.info.experiment_id)
    return {
        "status": run.info.status,
        "run_name": run.info.run_name,
        "experiment": experiment.name,
        "params": run.data.params,
        "tags": run.data.tags,
        "metrics": metrics,
    }


def tensorboard(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(folder, size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [[e.step, e.value] for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


if __name__ == "__main__":
    kind, *args = sys.argv[1:]
    print(json.dumps({"mlflow": mlflow, "tensorboard": tensorboard}[kind](*args)))
