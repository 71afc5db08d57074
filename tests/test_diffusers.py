"""diffusers on vnpu: tiny randomly initialised DDPM / DDIM pipelines denoise on the device and match CPU.

The noise comes from a CPU generator (diffusers' randn_tensor draws on the generator's device, then moves the
sample), so both devices see the same noise; the UNet, attention and schedulers then run on vnpu.
"""
import pytest
import torch

diffusers = pytest.importorskip("diffusers")
from diffusers import DDIMPipeline, DDIMScheduler, DDPMPipeline, DDPMScheduler, UNet2DModel  # noqa: E402

# Same ATen CPU kernels on both devices; measured max abs difference 2.4e-7 (images in [0, 1]), not bitwise
# (float reductions may split differently on the stream worker). The assertion allows 1e-5.
ATOL = RTOL = 1e-5


def _tiny_unet() -> UNet2DModel:
    torch.manual_seed(0)
    return UNet2DModel(
        sample_size=16, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=4, attention_head_dim=8,
    )


@pytest.mark.parametrize("kind", ["ddpm", "ddim"])
def test_tiny_pipeline_denoises_on_vnpu_like_cpu(kind):
    pipe_cls, sched_cls = (DDPMPipeline, DDPMScheduler) if kind == "ddpm" else (DDIMPipeline, DDIMScheduler)
    images = {}
    for device in ("cpu", "vnpu"):
        pipe = pipe_cls(unet=_tiny_unet(), scheduler=sched_cls(num_train_timesteps=50)).to(device)
        assert pipe.device.type == device
        assert {p.device.type for p in pipe.unet.parameters()} == {device}
        seen = []
        pipe.unet.register_forward_hook(lambda mod, args, out: seen.append(out.sample.device.type))
        out = pipe(batch_size=2, generator=torch.Generator("cpu").manual_seed(0), num_inference_steps=4,
                   output_type="np", return_dict=True)
        assert seen == [device] * 4  # every denoising step ran the UNet on this device
        images[device] = torch.from_numpy(out.images)
    assert images["vnpu"].shape == (2, 16, 16, 3)
    assert images["cpu"].std() > 0.05  # a non-trivial image, not a constant
    torch.testing.assert_close(images["vnpu"], images["cpu"], atol=ATOL, rtol=RTOL)
