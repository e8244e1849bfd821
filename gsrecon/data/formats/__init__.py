"""Scene file formats: COLMAP models, images, masks and the lens maths of undistortion."""
