"""What the elected worker does for the fleet, each duty a service of its own."""
