"""A pytorch/examples mnist-style script written for CUDA (use_cuda from torch.cuda.is_available(),
torch.device("cuda"), cuda_kwargs with pin_memory, Adadelta + StepLR, train/test loops), on scikit-learn's
bundled 8x8 digits (no download). Run unedited by tests/test_port.py under ``python -m torch_vnpu.port.run``;
``--no-cuda`` is the CPU run. Writes a JSON report to --out.
"""
import argparse
import json

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from sklearn.datasets import load_digits
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self, dropout=1.0):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, 1, padding=1)
        self.dropout1 = nn.Dropout(0.25 * dropout)
        self.dropout2 = nn.Dropout(0.5 * dropout)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def train(model, device, train_loader, optimizer, losses):
    model.train()
    for data, target in train_loader:
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())


def test(model, device, test_loader):
    model.eval()
    test_loss, correct = 0, 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.cuda() if device.type == "cuda" else data, target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += output.argmax(dim=1, keepdim=True).eq(target.view_as(output.argmax(1, keepdim=True))).sum().item()
    return test_loss / len(test_loader.dataset), correct


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--no-cuda", action="store_true")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dropout", type=float, default=1.0, help="scales the dropout probabilities")
    parser.add_argument("--out", default="mnist.json")
    args = parser.parse_args()
    use_cuda = not args.no_cuda and torch.cuda.is_available()
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if use_cuda else "cpu")

    train_kwargs = {"batch_size": args.batch_size}
    test_kwargs = {"batch_size": 256}
    if use_cuda:
        cuda_kwargs = {"num_workers": 0, "pin_memory": True, "shuffle": True}
        train_kwargs.update(cuda_kwargs)
        test_kwargs.update(cuda_kwargs)
    else:  # the same data order as the CUDA branch (the test loader's shuffle draws from the global generator)
        train_kwargs["shuffle"] = test_kwargs["shuffle"] = True

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target)
    x = (x - 0.3) / 0.4
    train_set, test_set = TensorDataset(x[:1400], y[:1400]), TensorDataset(x[1400:], y[1400:])
    train_loader = DataLoader(train_set, **train_kwargs)
    test_loader = DataLoader(test_set, **test_kwargs)

    model = Net(args.dropout).to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    losses, tests = [], []
    for _ in range(args.epochs):
        train(model, device, train_loader, optimizer, losses)
        tests.append(test(model, device, test_loader))
        scheduler.step()
    report = {
        "use_cuda": use_cuda,
        "losses": losses,
        "tests": tests,
        "param_devices": sorted({p.device.type for p in model.parameters()}),
        "pinned_batches": train_loader.pin_memory,
        "pin_memory_device": getattr(iter(train_loader), "_pin_memory_device", None),
    }
    with open(args.out, "w") as f:
        json.dump(report, f)
    print(json.dumps({k: v for k, v in report.items() if k != "losses"}))


if __name__ == "__main__":
    main()
