"""Softmax regression (64 pixels -> 10 digits) in numpy: what the sites train in turn."""

import numpy as np


def zeros() -> dict[str, np.ndarray]:
    return {"w": np.zeros((64, 10)), "b": np.zeros(10)}


def probabilities(params, x):
    z = x @ params["w"] + params["b"]
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def train(params, x, y, epochs, lr, batch_size, rng):
    params = {k: v.copy() for k, v in params.items()}
    for _ in range(epochs):
        for batch in np.array_split(rng.permutation(len(y)), max(1, len(y) // batch_size)):
            p = probabilities(params, x[batch])
            p[np.arange(len(batch)), y[batch]] -= 1.0
            p /= len(batch)
            params["w"] -= lr * x[batch].T @ p
            params["b"] -= lr * p.sum(axis=0)
    return params


def evaluate(params, x, y):
    p = probabilities(params, x)
    loss = float(-np.mean(np.log(np.clip(p[np.arange(len(y)), y], 1e-12, None))))
    return {"accuracy": float(np.mean(p.argmax(axis=1) == y)), "loss": loss}
