"""diffucoder: DiffuCoder / Dream masked-diffusion models on the diffucoder.cpp engine, with the Hugging Face
remote code's surface. Change one import line:

    from diffucoder import AutoModel, AutoTokenizer      # was: from transformers import ...

The engine's notes (weights left unpacked, a packed-weight cache not written, ...) are records of the logger
"diffucoder" (WARNING; progress at INFO), e.g. logging.getLogger("diffucoder").setLevel(logging.ERROR) to
silence them.
"""

from .modeling import AutoModel, DreamModel, DreamModelOutput
from .tokenization import AutoTokenizer, BatchEncoding, DreamTokenizer

__version__ = "0.1.0"
__all__ = ["AutoModel", "AutoTokenizer", "BatchEncoding", "DreamModel", "DreamModelOutput", "DreamTokenizer"]
