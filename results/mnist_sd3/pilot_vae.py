import torch, time, copy
torch.set_num_threads(1)
from integrations.testbed.mnist_sd3.build import build_pipeline
from integrations.testbed.mnist_sd3 import train as T
from integrations.testbed.checkpoints import load_pretrained
from integrations.testbed.data import load_mnist
from integrations.testbed.mnist_sd3.render import render_digits, TINTS
p = build_pipeline(0); vae = p.vae
clf = load_pretrained("classifier")
ed, el = load_mnist("eval")
tints = torch.arange(len(el)) % len(TINTS)
td, tl = load_mnist("train")
def cb(step, v):
    if step % 100 == 0:
        v.eval()
        means, _ = T.encode_moments(v, render_digits(td[:1000], torch.arange(1000) % 5))
        T.set_latent_statistics(v, means)
        print(step, T.round_trip_accuracy(v, clf, ed, el, tints), v.config.shift_factor, v.config.scaling_factor, flush=True)
        torch.save(v.state_dict(), f"/tmp/vae_{step}.pt")
        v.train()
T.train_vae(vae, steps=1000, batch_size=32, lr=2e-3, kl=1e-6, seed=100, callback=cb)
