"""Routing profiles: the format, synthetic and uniform profiles (recording and reports: ostinato-profile)."""

from ostinato.profile_format import PHASES, ProfileError, RoutingProfile, load_profile
from .synthetic import synthetic_profile, uniform_profile
