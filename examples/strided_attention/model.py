"""Seed 000's simplified Transformer: a stack of (attention, MLP) layers with pre-norm residuals."""

from torch import nn


class SimpleTransformerLayer(nn.Module):
    def __init__(self, embed_dim, num_heads, stride, attention_cls):
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dim)
        self.attention = attention_cls(embed_dim, num_heads, stride)
        self.norm2 = nn.LayerNorm(embed_dim)
        self.mlp = nn.Sequential(nn.Linear(embed_dim, 4 * embed_dim), nn.GELU(),
                                 nn.Linear(4 * embed_dim, embed_dim))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class SimpleModel(nn.Module):
    def __init__(self, embed_dim, num_heads, stride, attention_cls, num_layers=2):
        super().__init__()
        self.layers = nn.ModuleList(
            SimpleTransformerLayer(embed_dim, num_heads, stride, attention_cls)
            for _ in range(num_layers))
        self.head = nn.Linear(embed_dim, embed_dim)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)
