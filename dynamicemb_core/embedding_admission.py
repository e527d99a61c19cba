"""Compatibility module: ``dynamicemb.embedding_admission``'s public names (:mod:`dynamicemb_core.admission`)."""

from dynamicemb_core.admission import FrequencyAdmissionStrategy, KVCounter
from dynamicemb_core.types import AdmissionStrategy, Counter

__all__ = ["AdmissionStrategy", "Counter", "FrequencyAdmissionStrategy", "KVCounter"]
