//! A region's update in waves (docs/maintenance-plan.md): [`planner::plan`]
//! orders the hosts of a plan so that every VM moves once. Pure.

pub mod planner;
