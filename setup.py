"""Build hasfl-ray and its extension hasfl_ray._C (CPU kernels always; CUDA kernels when CUDA is there).

Environment switches:
    HASFL_NO_EXTENSION=1   skip the extension entirely (pure-torch fallbacks are used)
    HASFL_FORCE_CUDA=1     build the CUDA kernels even without a visible GPU (CI compiles them this way)
    TORCH_CUDA_ARCH_LIST   respected by torch; sm_90 (H100/H200) is always among the -gencode targets
    HASFL_NVCC_EXTRA       extra nvcc flags, space-separated (kernel variants for a GPU comparison, e.g.
                           "-DHASFL_CUDA_UNROLL_FLOAT=4 -DHASFL_CUDA_MIN_BLOCKS_FLOAT=2")
"""

import glob
import os

from setuptools import find_packages, setup


def _extension():
    if os.environ.get("HASFL_NO_EXTENSION") == "1":
        return [], {}
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
    except ImportError:
        return [], {}
    here = os.path.dirname(os.path.abspath(__file__))
    sources = sorted(glob.glob(os.path.join("csrc", "*.cpp")) + glob.glob(os.path.join("csrc", "cpu", "*.cpp")))
    if not sources:
        return [], {}
    force_cuda = os.environ.get("HASFL_FORCE_CUDA") == "1"
    use_cuda = CUDA_HOME is not None and (force_cuda or torch.cuda.is_available())
    cxx_flags = ["-O3", "-fopenmp", "-std=c++20"]  # torch >= 2.10 headers need C++20
    kwargs = dict(include_dirs=[os.path.join(here, "csrc")], extra_link_args=["-fopenmp"])
    if use_cuda:
        sources += sorted(glob.glob(os.path.join("csrc", "cuda", "*.cu")))
        nvcc_flags = ["-O3", "--use_fast_math", "-gencode=arch=compute_90,code=sm_90",
                      "-gencode=arch=compute_90,code=compute_90"] + os.environ.get("HASFL_NVCC_EXTRA", "").split()
        ext = CUDAExtension("hasfl_ray._C", sources, extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
                            **kwargs)
    else:
        ext = CppExtension("hasfl_ray._C", sources, extra_compile_args={"cxx": cxx_flags}, **kwargs)
    return [ext], {"build_ext": BuildExtension.with_options(use_ninja=True)}


ext_modules, cmdclass = _extension()

setup(
    name="hasfl-ray",
    version="0.1.0",
    description="HAS-FL and sub-model federated learning baselines on Ray actors, with a fused aggregation kernel",
    long_description=open("README.md", encoding="utf-8").read() if os.path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["hasfl_ray", "hasfl_ray.*"]),
    install_requires=[
        "torch>=2.4",
        "torchvision>=0.19",
        "numpy>=1.26",
        "scipy>=1.11",
        "click>=8.1",
        "pyyaml>=6.0",
        "scikit-learn>=1.3",
        "tqdm>=4.66",
        "matplotlib>=3.8",
        # The simulator is built on Ray (the default backend): a plain `pip install hasfl-ray` brings it.
        "ray>=2.9",
    ],
    extras_require={"ray": [], "test": ["pytest>=8", "hypothesis>=6.100", "pytest-xdist>=3.5,<4"],
                    # RUN/events/ for `tensorboard --logdir runs/` (written only when tensorboard imports)
                    "tensorboard": ["tensorboard>=2.14"],
                    # experiment trackers (--track, docs/notebook.md) and the notebook's DataFrame
                    "mlflow": ["mlflow>=2.10"], "wandb": ["wandb>=0.16"], "notebook": ["pandas>=2", "ipykernel>=6"],
                    # hasfl_ray.flower: a policy as a Flower strategy, its clients as Flower clients (docs/flower.md)
                    "flower": ["flwr[simulation]>=1.10"],
                    # client-level differential privacy's accountant (--dp-noise-multiplier, docs/privacy.md)
                    "privacy": ["dp-accounting>=0.4"],
                    # --dataset hf:PATH_OR_NAME and --partition flwr:... (docs/datasets.md)
                    "hub": ["datasets>=2.16", "flwr-datasets>=0.5"]},
    entry_points={"console_scripts": ["hasfl-ray=hasfl_ray.cli.entry:main"]},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
