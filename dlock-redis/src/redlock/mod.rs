pub struct RedlockLocker;
pub struct RedlockLockerBuilder;
