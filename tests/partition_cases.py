"""Problems only a partition covers (kernels with PyTorch between them), shared by the CPU and GPU
partition tests: a flip and a sort between linear layers; KernelBench level3's ResNet basic block, a
VGG-style stack and a transformer's attention, at smaller sizes."""

BASIC_BLOCK = """
        self.conv1 = nn.Conv2d(32, 64, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.conv2 = nn.Conv2d(64, 64, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(64)
        self.down = nn.Sequential(nn.Conv2d(32, 64, 1, bias=False), nn.BatchNorm2d(64))"""
VGG = """
        self.f = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(32, 32, 3, padding=1),
                               nn.ReLU(inplace=True), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 16 * 16, 64))"""
ATTENTION = """
        self.qkv = nn.Linear(64, 192)
        self.proj = nn.Linear(64, 64)"""
ATTEND = ("(lambda q, k, v: self.proj((torch.softmax(q @ k.transpose(-2, -1) / 4.0, dim=-1) @ v).transpose(1, 2)"
          ".reshape(2, 128, 64)))(*self.qkv(a).view(2, 128, 3, 4, 16).permute(2, 0, 3, 1, 4).unbind(0))")


CASES = [
    ("torch.relu(self.fc2(torch.flip(self.fc1(a), dims=[1]) + torch.sort(self.fc1(a), dim=1)[0]))", "torch.randn(16, 64)",
     "        self.fc1 = nn.Linear(64, 96)\n        self.fc2 = nn.Linear(96, 32)"),
    ("torch.relu(self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(a))))) + self.down(a))", "torch.randn(4, 32, 28, 28)",
     BASIC_BLOCK),
    ("self.f(a)", "torch.randn(8, 16, 32, 32)", VGG),
    (ATTEND, "torch.randn(2, 128, 64)", ATTENTION),
]
