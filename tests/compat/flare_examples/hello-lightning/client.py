"""A Lightning Client API script in the shape of FLARE 2.9's hello-lightning (written for
atoll's tests): patches the Trainer, validates the global model, then fits from it; synthetic
data stands in for CIFAR-10 (no download on the test machine)."""

import argparse
import zlib

# (0) import nvflare lightning client API
import nvflare.client.lightning as flare
import torch
from model import NUM_FEATURES, LitNet
from pytorch_lightning import LightningDataModule, Trainer, seed_everything
from torch.utils.data import DataLoader, TensorDataset

seed_everything(7)


class SyntheticDataModule(LightningDataModule):
    def __init__(self, site: str, batch_size: int):
        super().__init__()
        self.site = site
        self.batch_size = batch_size

    def setup(self, stage: str):
        gen = torch.Generator().manual_seed(zlib.crc32(self.site.encode()))
        shift = torch.randn(NUM_FEATURES, generator=gen) * 0.5
        x = torch.randn(400, NUM_FEATURES, generator=gen) + shift
        y = (x @ torch.linspace(-1.0, 1.0, NUM_FEATURES) > 0).long()
        self.train_set, self.val_set = TensorDataset(x[:300], y[:300]), TensorDataset(x[300:], y[300:])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)


def define_parser():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=1)
    return parser.parse_args()


def main():
    args = define_parser()

    # (1) flare.init() is only needed if the flare function is used (such as flare.get_site_name())
    flare.init()
    print(f"batch_size={args.batch_size}, site={flare.get_site_name()}")

    model = LitNet()
    dm = SyntheticDataModule(flare.get_site_name(), args.batch_size)
    trainer = Trainer(max_epochs=args.epochs, accelerator="cpu", devices=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False)

    # (2) patch the lightning trainer
    flare.patch(trainer)

    while flare.is_running():
        # (3) receives FLModel from NVFlare
        input_model = flare.receive()
        print(f"\n[Current Round={input_model.current_round}, Site = {flare.get_site_name()}]\n")

        # (4) evaluate the current global model to allow server-side model selection
        trainer.validate(model, datamodule=dm)

        # perform local training starting with the received global model
        trainer.fit(model, datamodule=dm)


if __name__ == "__main__":
    main()
