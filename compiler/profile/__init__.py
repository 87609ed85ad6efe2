"""Routing profiles, offline: synthetic and uniform profiles, reports, merges, CSV/NPZ import and export
(ostinato-profile). The file format is the core's (ostinato/profile_format.py); recording runs the model
(ostinato-record, on the runtime side)."""

from ostinato.profile_format import PHASES, ProfileError, RoutingProfile, load_profile

from .synthetic import synthetic_profile, uniform_profile
