// Placeholder until the first real file of this target lands.
