"""SCAFFOLD on the server: the global model x and control variate c go out, the sites' changes
(dy, dc) come back, server_update folds them in. Every round the sites validate the new x."""

from pydantic import BaseModel, Field
from scaffold import server_update, zeros

from atoll.workflow import Model, Workflow


class Args(BaseModel):
    num_rounds: int = Field(ge=1)
    server_lr: float = Field(1.0, gt=0)
    min_clients: int | None = None
    round_timeout: float | None = None


class Scaffold(Workflow):
    Args = Args

    # What survives a server restart: the global model and the control variate. The server
    # commits them after each round (self.checkpoint) and restores them before run().
    def state(self) -> dict:
        return {"x": self.x, "c": self.c}

    def restore(self, state: dict) -> None:
        self.x, self.c = dict(state["x"]), dict(state["c"])

    def run(self) -> None:
        ctx, args = self.ctx, self.args
        if not hasattr(self, "x"):  # a fresh start (not restored from a checkpoint)
            self.x = dict(ctx.initial_model.params) if ctx.initial_model else zeros()
            self.c = {name: value * 0 for name, value in self.x.items()}
        x, c = self.x, self.c
        # rounds count from 1, as users see them; after a restart, on from the checkpoint
        for round_ in range(ctx.start_round, args.num_rounds + 1):
            ctx.require_active(f"round {round_}")
            outgoing = Model(params={**x, **{f"c/{k}": v for k, v in c.items()}})
            sent = ctx.send("train", outgoing, round=round_, total_rounds=args.num_rounds)
            replies = ctx.gather(sent, timeout=args.round_timeout)
            dy = [{k: m.params[f"dy/{k}"] for k in x} for m in replies.results.values()]
            dc = [{k: m.params[f"dc/{k}"] for k in x} for m in replies.results.values()]
            x, c = server_update(x, c, dy, dc, args.server_lr, len(ctx.sites))
            for site, model in replies.results.items():
                ctx.log_metrics(model.metrics, round=round_, site=site)
            checked = ctx.ask("validate", Model(params=x), round=round_,
                              timeout=args.round_timeout)
            for site, model in checked.results.items():
                ctx.log_metrics(model.metrics, round=round_, site=site, phase="validate",
                                num_examples=model.num_examples)
            overall = checked.mean_metrics()
            ctx.log_metrics(overall, round=round_, phase="validate")
            self.x, self.c = x, c
            self.checkpoint(round_)
            ctx.report({"event": "round", "round": round_, "num_rounds": args.num_rounds,
                        "metrics": overall, "failed": {**replies.failed, **checked.failed}})
        ctx.save_model("global_model_final", Model(params=x))
        ctx.save_model("control_variate_final", Model(params=c))
