"""The server's model class for hello-huggingface (FLARE's recipe names it): a 2-layer GPT-2
built from a config, so nothing is downloaded; the client trains the same class."""

from transformers import GPT2Config, GPT2LMHeadModel

VOCAB, LENGTH = 32, 16


class TinyGPT2(GPT2LMHeadModel):
    def __init__(self):
        super().__init__(GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=2,
                                    n_head=2, bos_token_id=0, eos_token_id=0))
