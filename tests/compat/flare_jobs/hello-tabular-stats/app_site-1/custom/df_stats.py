"""A statistics generator in the shape of FLARE 2.9's hello-tabular-stats (written for atoll's
tests): a DFStatisticsCore subclass whose load_data() gives each dataset ("train", "test") as
a pandas DataFrame; synthetic records stand in for the UCI adult data (no download)."""

import zlib

import numpy as np
import pandas as pd
from nvflare.apis.fl_context import FLContext
from nvflare.app_opt.statistics.df.df_core_statistics import DFStatisticsCore


class SyntheticAdultStatistics(DFStatisticsCore):
    def __init__(self, rows: int = 200):
        super().__init__()
        self.rows = rows
        self.data: dict[str, pd.DataFrame] | None = None
        self.data_features = ["Age", "Education-Num", "Hours per week"]

    def load_data(self, fl_ctx: FLContext) -> dict[str, pd.DataFrame]:
        client_name = fl_ctx.get_identity_name()
        rng = np.random.default_rng(zlib.crc32(client_name.encode()))
        out = {}
        for name, count in (("train", self.rows), ("test", self.rows // 2)):
            out[name] = pd.DataFrame({
                "Age": rng.normal(40, 12, count).round().clip(17, 90),
                "Education-Num": rng.integers(1, 17, count).astype(float),
                "Hours per week": rng.normal(40, 10, count).round().clip(1, 99),
            }, columns=self.data_features)
        return out

    def initialize(self, fl_ctx: FLContext):
        self.data = self.load_data(fl_ctx)
        if self.data is None:
            raise ValueError("data is not loaded. make sure the data is loaded")
