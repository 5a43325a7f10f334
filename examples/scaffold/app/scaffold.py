"""SCAFFOLD's two updates (Karimireddy et al., ICML 2020, Algorithm 1, control variates option II)
and the softmax regression the example trains with them, in plain numpy.

Site i, from the global model x and control variate c, with its own control variate c_i:
    y <- y - lr * (g_i(y) - c_i + c)                      K local steps, y starting at x
    c_i+ = c_i - c + (x - y) / (K * lr)                   option II
    sends  dy = y - x,  dc = c_i+ - c_i                   and keeps c_i+
Server, with the replies of |S| of its N sites:
    x <- x + server_lr * mean(dy)
    c <- c + |S| / N * mean(dc)
"""

from collections.abc import Callable

import numpy as np

Params = dict[str, np.ndarray]
Gradient = Callable[[Params, int], Params]  # (params, local step) -> gradient


def client_update(x: Params, c: Params, c_i: Params, gradient: Gradient, steps: int,
                  lr: float) -> tuple[Params, Params]:
    """K corrected SGD steps from x; returns (y, c_i+)."""
    y = {name: value.copy() for name, value in x.items()}
    for step in range(steps):
        g = gradient(y, step)
        for name in y:
            y[name] -= lr * (g[name] - c_i[name] + c[name])
    c_i_new = {name: c_i[name] - c[name] + (x[name] - y[name]) / (steps * lr) for name in x}
    return y, c_i_new


def server_update(x: Params, c: Params, dy: list[Params], dc: list[Params], server_lr: float,
                  num_sites: int) -> tuple[Params, Params]:
    """The new (x, c) from the sites' model and control variate changes."""
    share = len(dc) / num_sites
    new_x = {n: x[n] + server_lr * np.mean([d[n] for d in dy], axis=0) for n in x}
    new_c = {n: c[n] + share * np.mean([d[n] for d in dc], axis=0) for n in c}
    return new_x, new_c


# --- the model: softmax regression, 64 pixels -> 10 digits ---------------------------------------

def zeros(features: int = 64, classes: int = 10) -> Params:
    return {"w": np.zeros((features, classes)), "b": np.zeros(classes)}


def probabilities(params: Params, x: np.ndarray) -> np.ndarray:
    logits = x @ params["w"] + params["b"]
    logits -= logits.max(axis=1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(axis=1, keepdims=True)


def gradient(params: Params, x: np.ndarray, y: np.ndarray) -> Params:
    """Of the mean cross-entropy over (x, y)."""
    p = probabilities(params, x)
    p[np.arange(len(y)), y] -= 1.0
    p /= len(y)
    return {"w": x.T @ p, "b": p.sum(axis=0)}


def evaluate(params: Params, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    p = probabilities(params, x)
    loss = float(-np.mean(np.log(np.clip(p[np.arange(len(y)), y], 1e-12, None))))
    return {"accuracy": float(np.mean(p.argmax(axis=1) == y)), "loss": loss}
