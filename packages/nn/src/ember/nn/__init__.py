"""ember.nn: layers, optimizers (`ember.nn.optim`), model state and weight files (`ember.nn.state`), data sets
(`ember.nn.datasets`) and functional ops (`ember.nn.functional`) on top of the ember Tensor.

>>> from ember import Tensor, nn
>>> model = nn.Sequential(nn.Linear(784, 128), Tensor.relu, nn.Linear(128, 10))
>>> model(Tensor.ones(2, 784)).shape
(2, 10)
"""
from __future__ import annotations
from ember.nn.layers import (Linear, Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, BatchNorm, BatchNorm1d,
                             BatchNorm2d, BatchNorm3d, LayerNorm, RMSNorm, GroupNorm, InstanceNorm, Embedding, Dropout,
                             LSTMCell, Sequential, Identity, ReLU, SiLU, Sigmoid, Tanh, GELU, LeakyReLU, ELU,
                             Softmax, LogSoftmax, Flatten, MaxPool2d, AvgPool2d, Upsample, ModuleList,
                             MultiheadAttention, RNN, LSTM, GRU)
from ember.nn.module import Buffer, IncompatibleKeys, Module, Parameter
from ember.nn import functional, optim, state

__all__ = ["Linear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "BatchNorm", "BatchNorm1d",
           "BatchNorm2d", "BatchNorm3d", "LayerNorm", "RMSNorm", "GroupNorm", "InstanceNorm", "Embedding", "Dropout",
           "LSTMCell", "Sequential", "Identity", "ReLU", "SiLU", "Sigmoid", "Tanh", "GELU", "LeakyReLU", "ELU",
           "Softmax", "LogSoftmax", "Flatten", "MaxPool2d", "AvgPool2d", "Upsample", "ModuleList", "MultiheadAttention",
           "RNN", "LSTM", "GRU", "Module", "Parameter", "Buffer", "IncompatibleKeys", "functional", "optim", "state"]
