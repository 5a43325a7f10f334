import pytorch_lightning as pl
import torch
from torch import nn
from torch.nn import functional as F

NUM_FEATURES, NUM_CLASSES = 10, 2


class LitNet(pl.LightningModule):
    """A small classifier as a LightningModule, in the shape of FLARE 2.9's hello-lightning."""

    def __init__(self, lr: float = 0.1):
        super().__init__()
        self.lr = lr
        self.model = nn.Sequential(nn.Linear(NUM_FEATURES, 16), nn.ReLU(),
                                   nn.Linear(16, NUM_CLASSES))

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_epoch=True, on_step=False)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), on_epoch=True)
        self.log("val_acc_epoch", (logits.argmax(1) == y).float().mean(), on_epoch=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)
