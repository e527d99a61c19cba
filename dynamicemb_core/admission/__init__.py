"""Admission of new keys: the built-in counter and frequency strategy."""

from dynamicemb_core.admission.frequency import FrequencyAdmissionStrategy
from dynamicemb_core.admission.kv_counter import KVCounter

__all__ = ["FrequencyAdmissionStrategy", "KVCounter"]
