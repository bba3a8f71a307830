"""The peer: PyTorch's `nn.Transformer` with the same dimensions and the same training recipe.

Shared source/target/output embedding scaled by sqrt(d_model), sinusoidal positions, post-LN, dropout,
label-smoothed cross-entropy ignoring padding, Adam(0.9, 0.98, 1e-9) with the paper's schedule. The
differences that remain are PyTorch's: `nn.Transformer` adds a final LayerNorm to each stack and has a
bias on the key projection (2 x d_model parameters per layer more), and its label smoothing spreads
eps over all V tokens (ours over the V - 1 non-reference ones). Neither changes the FLOP count.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from transformer_jax import TransformerConfig
from transformer_jax.model import PAD_ID


class PeerTransformer(nn.Module):
    """nn.Transformer between one shared embedding table and its transpose."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        d = config.d_model
        self.d_model = d
        self.embedding = nn.Embedding(config.vocab_size, d, padding_idx=PAD_ID)
        nn.init.normal_(self.embedding.weight, std=d**-0.5)
        self.transformer = nn.Transformer(
            d, config.num_heads, config.num_layers, config.num_layers, config.d_ff, config.dropout_rate,
            batch_first=True, norm_first=config.norm_position == "pre",
        )
        self.dropout = nn.Dropout(config.dropout_rate)
        position = torch.arange(config.max_len, dtype=torch.float32)[:, None]
        rates = torch.pow(10000.0, -torch.arange(0, d, 2, dtype=torch.float32) / d)
        encoding = torch.zeros(config.max_len, d)
        encoding[:, 0::2], encoding[:, 1::2] = torch.sin(position * rates), torch.cos(position * rates)
        self.register_buffer("positions", encoding)

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens) * math.sqrt(self.d_model) + self.positions[: tokens.shape[1]]
        return self.dropout(x)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[1], dtype=torch.bool)
        hidden = self.transformer(
            self._embed(src), self._embed(tgt_in), tgt_mask=causal, tgt_is_causal=True,
            src_key_padding_mask=src == PAD_ID, tgt_key_padding_mask=tgt_in == PAD_ID,
            memory_key_padding_mask=src == PAD_ID,
        )
        return F.linear(hidden, self.embedding.weight)


def peer_train_step(config: TransformerConfig, batch: dict[str, np.ndarray], smoothing: float = 0.1,
                    warmup_steps: int = 4000) -> Callable[[], float]:
    """A closure running one PyTorch training step on `batch` (and returning the loss)."""
    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    model = PeerTransformer(config)
    schedule = lambda step: config.d_model**-0.5 * min((step + 1) ** -0.5, (step + 1) * warmup_steps**-1.5)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    lr_schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    src, tgt_in, targets = (torch.from_numpy(batch[k]).long() for k in ("inputs", "target_inputs", "targets"))
    model.train()

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        logits = model(src, tgt_in)
        loss = F.cross_entropy(logits.reshape(-1, config.vocab_size), targets.reshape(-1),
                               ignore_index=PAD_ID, label_smoothing=smoothing)
        loss.backward()
        optimizer.step()
        lr_schedule.step()
        return loss.item()  # synchronizes, as our step blocks on its metrics

    return step


def peer_parameter_count(config: TransformerConfig) -> int:
    """Trainable parameters of the peer (for the record)."""
    return sum(p.numel() for p in PeerTransformer(config).parameters())
