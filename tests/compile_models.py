"""Small modules shared by the torch.compile tests (test_compile_parity.py, test_compile_cpp_wrapper.py,
test_compile_aoti.py): each test file compiles them its own way and compares with eager CPU."""
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    """Linear-GELU-Linear; input (N, 16), output (N, 8)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))

    def forward(self, x):
        return self.net(x)


class ConvBN(nn.Module):
    """Conv2d + BatchNorm2d + ReLU, mean-pooled into a linear head; input (N, 3, H, W), output (N, 4)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(F.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


class Attention(nn.Module):
    """Multi-head self-attention through scaled_dot_product_attention; input and output (B, T, dim)."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(B, T, C))
