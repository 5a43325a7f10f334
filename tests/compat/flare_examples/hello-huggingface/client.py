"""A Hugging Face Client API script in the shape of FLARE 2.9's hello-huggingface (written for
atoll's tests): a plain Trainer script, federated by flare.patch(trainer); a tiny GPT-2 built
from a config and synthetic token sequences stand in for Qwen and its JSONL data (no
download on the test machine)."""

import argparse
import tempfile
import zlib

# (1) import NVFlare HuggingFace Client API
import nvflare.client.hf as flare
import torch
from model import LENGTH, VOCAB, TinyGPT2
from transformers import Trainer, TrainingArguments


class Sequences(torch.utils.data.Dataset):
    """Token sequences counting up in steps of 1-3 (mod VOCAB); each site draws its own."""

    def __init__(self, site, count, salt=0):
        gen = torch.Generator().manual_seed(zlib.crc32(site.encode()) + salt)
        start = torch.randint(0, VOCAB, (count, 1), generator=gen)
        step = torch.randint(1, 4, (count, 1), generator=gen)
        self.ids = (start + step * torch.arange(LENGTH)) % VOCAB

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def define_parser():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_epochs", type=float, default=1.0)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.005)
    return parser.parse_args()


def main():
    args = define_parser()

    # (2) initialize the Client API before reading the site's name
    flare.init()
    site_name = flare.get_site_name()
    print(f"site={site_name}")

    training_args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hello-hf-"), num_train_epochs=args.local_epochs,
        learning_rate=args.lr, per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=64, logging_strategy="epoch", save_strategy="no",
        eval_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True, seed=0)
    trainer = Trainer(model=TinyGPT2(), args=training_args,
                      train_dataset=Sequences(site_name, 128),
                      eval_dataset=Sequences(site_name, 32, salt=1))

    # (3) patch the trainer: it receives the global model, trains and sends the result
    flare.patch(trainer)

    while flare.is_running():
        trainer.evaluate()  # the global model's metrics
        trainer.train()


if __name__ == "__main__":
    main()
